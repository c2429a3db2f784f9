"""The quality study's report: gaps, spread, divergence and bytes per variant."""

from __future__ import annotations

import pytest

from pipelines.studies.quality_report import RunLog, summarize


def _log(model: str, variant: str, val: float, seed: int, *, diverged=False, nbytes=100.0):
    steps = [{"step": 1, "tokens": 8, "loss": val, "bytes": nbytes, "max_age": 3}]
    final = {"event": "final", "final_val_loss": val, "diverged": diverged}
    return RunLog({"model": model, "variant": variant, "seed": seed}, steps, final)


def test_summary_gap_spread_divergence_and_bytes() -> None:
    runs = [
        _log("m", "adams", 4.0, 0),
        _log("m", "adams", 4.2, 1),
        _log("m", "scape99", 4.1, 0, nbytes=5.0),
        _log("m", "scape99", 4.3, 1, nbytes=5.0, diverged=True),
    ]
    rows = {r.variant: r for r in summarize(runs, ["adams", "scape99"])}
    assert rows["adams"].gap_pct == 0.0 and rows["adams"].bytes_ratio == 1.0
    assert rows["adams"].val_std == pytest.approx(0.1414, abs=1e-4)
    assert rows["scape99"].gap_pct == pytest.approx(100 * 0.1 / 4.1)
    assert rows["scape99"].diverged == 1 and rows["scape99"].bytes_ratio == 0.05
    assert rows["scape99"].max_age == 3
    # paired by seed: +2.5% and +2.38%
    assert rows["scape99"].paired_gap_pct == pytest.approx(50 * (0.1 / 4.0 + 0.1 / 4.2))
    assert rows["adams"].paired_gap_pct == 0.0 and rows["adams"].paired_gap_std == 0.0
