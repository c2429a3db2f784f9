"""The shipped SCAPE configs carry what the verdict's evidence supports: the lr ratio to dense
AdamS in results/quality/recipe.json where it is a rule, else 1 (the README says how to
tune), and the values' dtype the bf16-wire runs support. Written by the quality report; a
config edited by hand, or a new recipe not carried to the configs, fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.training.config import compose

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("variant", ["scape90", "scape99"])
def test_the_configs_lr_multiplier_is_the_recipes(variant: str) -> None:
    recipe = json.loads((REPO / "results" / "quality" / "recipe.json").read_text())
    expected = recipe["methods"][variant]["multiplier"] or 1.0
    assert compose([f"optimizer={variant}"]).optimizer.lr_multiplier == expected


@pytest.mark.parametrize("variant", ["scape90", "scape99"])
def test_the_configs_wire_is_the_recipes(variant: str) -> None:
    recipe = json.loads((REPO / "results" / "quality" / "recipe.json").read_text())
    expected = recipe.get("wire", {}).get("value_dtype", "float32")
    assert compose([f"optimizer={variant}"]).optimizer.scape.value_dtype == expected
