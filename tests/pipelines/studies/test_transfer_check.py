"""The transfer checks' bookkeeping (the runs themselves are the pretrain stage's)."""

from __future__ import annotations

from pathlib import Path

from pipelines.studies import transfer_check


def test_the_ramp_check_runs_both_arms_per_family_and_seed(monkeypatch, tmp_path: Path):
    calls = []

    def fake_run(variant, family, multiplier, seed, root, extra=(), tag=""):
        calls.append((variant, family, multiplier, seed, extra, tag))
        return 4.0 - (0.1 if extra else 0.0) - 0.01 * seed / 1234

    monkeypatch.setattr(transfer_check, "_run", fake_run)
    out = transfer_check.check_ramp(tmp_path)
    assert set(out["checks"]) == set(transfer_check.EXPERIMENTS)
    n = len(transfer_check.SEEDS)
    assert len(calls) == 2 * n * len(transfer_check.EXPERIMENTS)
    assert all(c[0] == "scape99" and c[2] == 1.0 for c in calls)
    ramped = [c for c in calls if c[4]]
    assert {c[4] for c in ramped} == {transfer_check.RAMP} and {c[5] for c in ramped} == {"-ramp"}
    assert all(entry["ramp_better_every_seed"] for entry in out["checks"].values())
