"""The shipped SCAPE configs carry what the verdict's evidence supports: the lr ratio to dense
AdamS per model family from results/quality/recipe.json (a family's ratio where three or
more of its sizes agree, else the multiplier whose worst gap over its sizes is least; 1 for a
family without one), applied to the model's family, and the values' dtype the bf16-wire runs
support. Written by the quality report; a config edited by hand, or a new recipe not carried
to the configs, fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.training.config import compose

REPO = Path(__file__).resolve().parents[1]


FAMILY_MODELS = {"gpt": "tiny_gpt", "llama": "tiny_llama"}


@pytest.mark.parametrize("variant", ["scape90", "scape99"])
def test_the_configs_lr_multiplier_per_family_is_the_recipes(variant: str) -> None:
    from pipelines.studies.recipe import family_multipliers
    from pipelines.studies.report_stats import SHIPPED_CONFIGS, VERDICT_METHODS

    # each shipped config is one verdict method's study variant (SCAPE-99: its ramp)
    assert sorted(SHIPPED_CONFIGS) == sorted(v for _, v, _ in VERDICT_METHODS)
    recipe = json.loads((REPO / "results" / "quality" / "recipe.json").read_text())
    study_variant = next(v for v, c in SHIPPED_CONFIGS.items() if c == variant)
    assert study_variant in recipe["methods"], (
        f"recipe.json has no {study_variant}: make quality-report"
    )
    expected = family_multipliers(recipe, study_variant)
    assert set(expected) == set(FAMILY_MODELS), expected  # the recipe speaks for every family
    for family, model in FAMILY_MODELS.items():
        cfg = compose([f"optimizer={variant}", f"model={model}"])
        assert dict(cfg.optimizer.lr_multiplier_by_family) == expected
        assert cfg.optimizer.lr_multiplier == expected[family], (variant, family)


def test_a_multiplier_on_the_command_line_wins_and_dense_methods_keep_theirs() -> None:
    cfg = compose(["optimizer=scape99", "model=tiny_llama", "optimizer.lr_multiplier=3"])
    assert cfg.optimizer.lr_multiplier == 3.0
    assert compose(["optimizer=adams", "model=tiny_llama"]).optimizer.lr_multiplier == 1.0


@pytest.mark.parametrize("variant", ["scape90", "scape99"])
def test_the_configs_wire_is_the_recipes(variant: str) -> None:
    recipe = json.loads((REPO / "results" / "quality" / "recipe.json").read_text())
    expected = recipe.get("wire", {}).get("value_dtype", "float32")
    assert compose([f"optimizer={variant}"]).optimizer.scape.value_dtype == expected
