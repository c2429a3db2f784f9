"""One quality-study run: its lr schedule, and when a run counts as finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.studies.quality_run import completed_run, lr_at


def test_lr_schedule_warms_up_then_decays_to_min(compose_study) -> None:
    scale = compose_study().scale
    lrs = [lr_at(t, scale) for t in range(scale.steps)]
    assert lrs[0] == pytest.approx(scale.lr / scale.warmup_steps)
    assert max(lrs) == pytest.approx(scale.lr)
    assert lrs[-1] == pytest.approx(scale.min_lr, rel=1e-3)
    assert all(
        a >= b
        for a, b in zip(lrs[scale.warmup_steps :], lrs[scale.warmup_steps + 1 :], strict=False)
    )


def test_completed_run_needs_final_record_and_same_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"event": "header", "fingerprint": "abc"}) + "\n")
    assert completed_run(path, "abc") is None  # no final record: unfinished
    with open(path, "a") as f:
        f.write(json.dumps({"event": "final", "final_val_loss": 1.0}) + "\n")
    assert completed_run(path, "abc") == {"event": "final", "final_val_loss": 1.0}
    assert completed_run(path, "other") is None


def test_divergence_needs_a_sustained_excursion_not_one_spike() -> None:
    from pipelines.studies.quality_run import DivergenceRule

    rule = DivergenceRule(vocab_size=1024, patience=20)  # level: log(1024) + 1 = 7.93
    assert not rule.diverged(6.16) and not rule.diverged(8.20)  # the spike that once ended a run
    assert not any(rule.diverged(6.0) for _ in range(100))
    assert [rule.diverged(9.0) for _ in range(20)] == [False] * 19 + [True]
    assert rule.spike_steps == 21
    assert DivergenceRule(1024).diverged(float("nan"))
