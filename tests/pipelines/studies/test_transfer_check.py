"""The transfer checks' bookkeeping (the runs themselves are the pretrain stage's)."""

from __future__ import annotations

from pathlib import Path

from pipelines.studies import transfer_check


def test_the_ramp_check_runs_both_arms_per_family_and_seed(monkeypatch, tmp_path: Path):
    calls = []

    def fake_run(variant, family, multiplier, seed, root, extra=(), tag=""):
        calls.append((variant, family, multiplier, seed, extra, tag))
        return 4.0 - (0.1 if extra == transfer_check.RAMP else 0.0) - 0.01 * seed / 1234

    monkeypatch.setattr(transfer_check, "_run", fake_run)
    out = transfer_check.check_ramp(tmp_path)
    assert set(out["checks"]) == set(transfer_check.EXPERIMENTS)
    n = len(transfer_check.SEEDS)
    assert len(calls) == 2 * n * len(transfer_check.EXPERIMENTS)
    assert all(c[0] == "scape99" and c[2] == 1.0 for c in calls)
    # both arms say what they are: the shipped scape99 ramps, so the constant turns it off
    arms = {c[5]: c[4] for c in calls}
    assert arms == {"-ramp": transfer_check.RAMP, "-constant": transfer_check.NO_RAMP}
    assert all(entry["ramp_better_every_seed"] for entry in out["checks"].values())


def test_the_rule_check_runs_the_shipped_config_of_a_study_variant(monkeypatch, tmp_path: Path):
    calls = []

    def fake_run(variant, family, multiplier, seed, root, extra=(), tag=""):
        calls.append((variant, family, multiplier))
        return 4.0 - 0.01 * multiplier

    monkeypatch.setattr(transfer_check, "_run", fake_run)
    recipe = {"methods": {"scape99_ramp": {"families": {"llama": {"multiplier": 2.0},
                                                        "gpt": {"multiplier": 1.0}}}}}  # fmt: skip
    out = transfer_check.check(recipe, tmp_path)
    # the study's scape99_ramp is what users run as optimizer=scape99; x1 families need no check
    assert {c[:2] for c in calls} == {("scape99", "llama")}
    assert out["checks"]["scape99_ramp"]["llama"]["holds"]
