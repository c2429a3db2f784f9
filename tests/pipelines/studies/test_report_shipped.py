"""The verdict of what ships: SCAPE at its configs' lr multipliers (not the lr tuned per
cell) against dense AdamS and AdamW at theirs, and the steps it needs to reach their loss."""

from __future__ import annotations

import pytest

from pipelines.studies.report_shipped import (
    shipped_cell,
    shipped_multipliers,
    shipped_table,
    shipped_verdict_text,
)
from pipelines.studies.report_stats import VERDICT_METHODS
from pipelines.studies.run_index import RunIndex, RunLog

S90, S99 = (v for _, v, _ in VERDICT_METHODS)
SHIPPED = {S90: {"gpt": 1.0, "llama": 1.0}, S99: {"gpt": 2.0, "llama": 2.0}}


def _run(model, variant, lr, seed, final, *, steps=100, start=6.0):
    """A run whose periodic validation loss falls linearly from ``start`` to ``final``."""
    header = {"model": model, "variant": variant, "seed": seed, "steps": steps, "lr_scale": lr,
              "params": 220_000, "code": {"commit": "c", "dirty": False, "step_code": "v"}}  # fmt: skip
    points = range(steps // 10, steps + 1, steps // 10)
    curve = [{"step": s, "loss": 0.0, "val_loss": start + (final - start) * s / steps}
             for s in points]  # fmt: skip
    return RunLog(header, curve, {"event": "final", "final_val_loss": final, "diverged": False})


def _cell_runs(model, steps=100, scape_x2=4.2, scape_x1=4.04, seeds=(0, 1)):
    runs = []
    for lr, loss in {0.5: 4.2, 1.0: 4.0, 2.0: 4.1}.items():  # AdamS: x1 chosen, grid closed
        runs += [_run(model, "adams", lr, s, loss, steps=steps) for s in seeds]
    for lr, loss in {0.5: 4.0, 1.0: 3.9, 2.0: 3.95}.items():  # AdamW: x1 chosen
        runs += [_run(model, "adamw", lr, s, loss, steps=steps) for s in seeds]
    for variant in (S90, S99):  # tuned best at x1; SCAPE-99 ships x2
        runs += [_run(model, variant, 1.0, s, scape_x1, steps=steps) for s in seeds]
        runs += [_run(model, variant, 2.0, s, scape_x2, steps=steps) for s in seeds]
        runs += [_run(model, variant, 0.5, s, 4.5, steps=steps) for s in seeds]
    return runs


def test_the_shipped_arm_is_the_configs_multiplier_not_the_tuned_lr():
    index = RunIndex(_cell_runs("llama"))
    cell = shipped_cell(index, "llama", S99, 100, 2.0)
    assert cell.lr == 2.0  # x2 AdamS's chosen x1
    assert cell.to_adams == pytest.approx([5.0, 5.0])  # 4.2 against 4.0, not the tuned 4.04
    assert cell.to_adamw == pytest.approx([100 * (4.2 - 3.9) / 3.9] * 2)
    assert cell.adams_closed and cell.adamw_closed
    assert shipped_cell(index, "llama", S90, 100, 1.0).to_adams == pytest.approx([1.0, 1.0])


def test_steps_to_target_read_off_the_curve_then_a_longer_run_else_not_reached():
    # AdamW's curve ends at 3.9; SCAPE's, 6 - 2.2 s / 100, is at or below it from s = 95.5:
    # its first logged point there is step 100 of 100
    runs = _cell_runs("llama", scape_x2=3.8)
    cell = shipped_cell(RunIndex(runs), "llama", S99, 100, 2.0)
    assert cell.target_adamw.ratio == pytest.approx(1.0) and cell.target_adamw.read_at == 100
    assert cell.target_adamw.text(100) == "1.00"
    # 6 - 3 s / 100 reaches 3.9 at s = 70, a logged point
    runs = _cell_runs("llama", scape_x2=3.0)
    assert shipped_cell(RunIndex(runs), "llama", S99, 100, 2.0).target_adamw.ratio == pytest.approx(
        0.7
    )
    # not reached in its own horizon (4.2 > 3.9): read off the 200-step run (x2 AdamS's
    # chosen lr there), whose curve 6 - 2.5 s / 200 is at or below 3.9 from s = 168
    longer = _cell_runs("llama", steps=200, scape_x2=3.5)
    cell = shipped_cell(RunIndex(_cell_runs("llama") + longer), "llama", S99, 100, 2.0)
    # (its first logged point there: step 180)
    assert cell.target_adamw.ratio == pytest.approx(1.8) and cell.target_adamw.read_at == 200
    assert cell.target_adamw.text(100) == "1.80 (200-step run)"
    cell = shipped_cell(RunIndex(_cell_runs("llama")), "llama", S99, 100, 2.0)
    assert cell.target_adamw.ratio is None
    assert cell.target_adamw.text(100) == "> 1 (not reached by step 100)"


def test_the_verdict_and_table_report_the_shipped_arm_and_name_the_tuned_one():
    index = RunIndex(_cell_runs("llama") + _cell_runs("gpt"))
    text = shipped_verdict_text(index, ["llama", "gpt"], SHIPPED)
    assert "As shipped, at 99% sparsity SCAPE-99 ends +5.0 ± 0.0% (n=2) on llama" in text
    assert "(lr x2 AdamS's; behind dense AdamS in every seed)" in text
    assert "+7.7 ± 0.0% (n=2) against dense AdamW (behind it in every seed)" in text
    assert "As shipped, at 90% sparsity SCAPE-90 ends +1.0 ± 0.0% (n=2) on llama" in text
    assert "at 100 steps" in text and "code version `v`" in text
    table = shipped_table(index, ["llama", "gpt"], SHIPPED)
    assert "| 100 | llama | SCAPE-99 | x2 | +5.0 ± 0.0% (n=2) |" in table
    assert table.rstrip().endswith("+1.0 ± 0.0% (n=2) (x1) |")  # the tuned gap, named
    # SCAPE-99 not run at its shipped lr: no verdict, and the table says so
    unshipped = [r for r in index.all_runs
                 if not (r.header["variant"] == S99 and r.header["lr_scale"] == 2.0)]  # fmt: skip
    assert shipped_verdict_text(RunIndex(unshipped), ["llama", "gpt"], SHIPPED).startswith(
        "No verdict of the shipped configs yet"
    )
    assert "| SCAPE-99 | x2 | not run at this lr |" in shipped_table(
        RunIndex(unshipped), ["llama", "gpt"], SHIPPED
    )


def test_the_multipliers_are_read_from_the_shipped_configs(tmp_path):
    for config, x in (("scape90", 1.0), ("scape99", 3.0)):
        (tmp_path / f"{config}.yaml").write_text(
            f"name: scape\nlr_multiplier_by_family:\n  gpt: {x}\n  llama: {2 * x}\n"
        )
    assert shipped_multipliers(tmp_path) == {S90: {"gpt": 1.0, "llama": 2.0},
                                             S99: {"gpt": 3.0, "llama": 6.0}}  # fmt: skip
    assert set(shipped_multipliers()) == {S90, S99}  # the repository's own configs


def test_the_headline_horizon_is_the_longest_that_meets_the_protocol():
    # 3 seeds and closed dense grids at 100 steps; only 2 seeds at 200: the headline stays at
    # 100, and takes 200 once it has the third seed
    three = [m for model in ("llama", "gpt") for m in _cell_runs(model, seeds=(0, 1, 2))]
    longer = [m for model in ("llama", "gpt") for m in _cell_runs(model, steps=200)]
    text = shipped_verdict_text(RunIndex(three + longer), ["llama", "gpt"], SHIPPED)
    assert "at 100 steps" in text and "(n=3)" in text and "(n=2)" not in text
    longer += [m for model in ("llama", "gpt") for m in _cell_runs(model, steps=200, seeds=(2,))]
    assert "at 200 steps" in shipped_verdict_text(RunIndex(three + longer), ["llama", "gpt"],
                                                  SHIPPED)  # fmt: skip
