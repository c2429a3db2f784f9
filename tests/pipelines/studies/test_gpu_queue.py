"""The GPU queue's plan, grids, bookkeeping and windows (pipelines.studies.gpu_queue)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.studies.gpu_queue import (
    GPU_METHODS,
    done_runs,
    estimate_seconds,
    lr_grid,
    measured_seconds_per_step,
    next_runs,
    plan,
)
from pipelines.studies.quality_config import ModelSpec, ScaleConfig, VariantSpec

RECIPE = {"methods": {
    "scape99_ramp": {"families": {"llama": {"multiplier": 2.0}, "gpt": {"multiplier": 1.0}}},
    "scape90": {"families": {"llama": {"multiplier": 4.0}, "gpt": {"multiplier": 0.5}}},
}}  # fmt: skip
MODELS = [ModelSpec(name="l", family="llama"), ModelSpec(name="g", family="gpt")]
VARIANTS = {
    "adams": VariantSpec(method="adams", core=True),
    "adamw": VariantSpec(method="adamw", core=True),
    "scape90": VariantSpec(method="scape", core=True, options={"sparsity": 0.9}),
    "scape99_ramp": VariantSpec(
        method="scape",
        core=True,
        options={"sparsity": 0.99, "ramp_start_sparsity": 0.9, "ramp_fraction": 0.15},
    ),
}
SCALE = ScaleConfig(name="gpu", steps=10)


def test_grids_are_placed_by_the_recipe_and_hold_x1_within_x4():
    assert lr_grid(RECIPE, "scape99_ramp", "llama") == (1.0, 2.0, 4.0)
    assert lr_grid(RECIPE, "scape90", "llama") == (1.0, 2.0, 4.0)
    assert lr_grid(RECIPE, "scape99_ramp", "gpt") == (0.5, 1.0, 2.0)
    assert lr_grid(RECIPE, "scape90", "gpt") == (0.25, 0.5, 1.0)
    assert lr_grid(RECIPE, "adams", "llama") == (0.5, 1.0, 2.0)  # not in the recipe
    assert lr_grid({}, "scape99_ramp", "llama") == (0.5, 1.0, 2.0)


def test_the_plan_covers_every_cell_once_in_the_verdicts_order():
    runs = plan(MODELS, VARIANTS, SCALE, "data/x", RECIPE)
    assert len(runs) == 2 * 2 * len(GPU_METHODS) * 3  # models x seeds x methods x grid
    assert len({r.run_id for r in runs}) == len(runs)
    first = [(r.model, r.variant, r.spec.seed, r.spec.lr_scale) for r in runs[:4]]
    assert first == [("l", "adams", 0, 1.0), ("l", "scape99_ramp", 0, 2.0),
                     ("l", "scape90", 0, 2.0), ("l", "adamw", 0, 1.0)]  # fmt: skip
    seeds_of_l = [r.spec.seed for r in runs if r.model == "l"]
    assert seeds_of_l == sorted(seeds_of_l)  # seed 1 after every seed-0 run
    with pytest.raises(ValueError, match=r"\['sgd'\] are not variants"):
        plan(MODELS, VARIANTS, SCALE, "data/x", RECIPE, methods=["sgd"])


def _record(root: Path, code: str, run, *, seconds: float, fingerprint: str | None = None,
            finished: bool = True) -> None:  # fmt: skip
    path = root / code / f"{run.run_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"event": "header", "model": run.model, "variant": run.variant,
              "fingerprint": fingerprint or run.spec.fingerprint()}  # fmt: skip
    lines = [header, {"step": 10, "loss": 5.0}]
    if finished:
        lines.append({"event": "final", "steps": 10, "final_val_loss": 4.0, "seconds": seconds})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_done_means_finished_with_its_fingerprint_at_this_code_version(tmp_path: Path):
    runs = plan(MODELS, VARIANTS, SCALE, "data/x", RECIPE)
    _record(tmp_path, "aaa", runs[0], seconds=20)
    _record(tmp_path, "aaa", runs[1], seconds=30, finished=False)  # cut: not done
    _record(tmp_path, "aaa", runs[2], seconds=30, fingerprint="other settings")
    _record(tmp_path, "bbb", runs[3], seconds=25)  # another code version
    assert set(done_runs(tmp_path, "aaa", runs)) == {runs[0].run_id}
    (tmp_path / "equivalent.json").write_text(json.dumps([{"code": "aaa", "same_as": "bbb"}]))
    assert set(done_runs(tmp_path, "aaa", runs)) == {runs[0].run_id, runs[3].run_id}


def test_estimates_learn_from_records_and_windows_take_what_fits(tmp_path: Path):
    runs = plan(MODELS, VARIANTS, SCALE, "data/x", RECIPE)
    adams_l, scape99_l = runs[0], runs[1]
    _record(tmp_path, "aaa", adams_l, seconds=20.0)  # 2 s a step
    measured = measured_seconds_per_step(tmp_path)
    assert measured == {("l", "adams"): 2.0}
    start = estimate_seconds(adams_l, 1, {})  # start-up only, at 1 parameter
    assert estimate_seconds(adams_l, 1, measured) == pytest.approx(start + 20.0)
    # SCAPE on the same model: the dense rate times the sparse factor, until measured
    assert estimate_seconds(scape99_l, 1, measured) > estimate_seconds(adams_l, 1, measured)
    estimates = {r.run_id: 100.0 if r.variant == "scape99_ramp" else 50.0 for r in runs}
    chosen = next_runs(runs, {adams_l.run_id}, estimates, budget_s=160)
    # scape99 (100) first, then what still fits in the 60 s left: one 50 s run
    assert [r.run_id for r in chosen] == [runs[1].run_id, runs[2].run_id]
