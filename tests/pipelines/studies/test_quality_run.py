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
