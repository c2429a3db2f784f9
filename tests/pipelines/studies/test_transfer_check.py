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


def test_the_grid_check_extends_an_edge_best_until_closed_and_resumes(monkeypatch, tmp_path: Path):
    import json
    import math

    best = {"adams": 0.125, "adamw": 1.0, "scape90": 8.0, "scape99": 2.0}  # two off the grid
    calls = []

    def fake_run(variant, family, multiplier, seed, root, extra=(), tag=""):
        calls.append((variant, family, multiplier, seed))
        return 4.0 + math.log2(multiplier / best[variant]) ** 2 + 0.001 * (seed - 1234)

    monkeypatch.setattr(transfer_check, "_run", fake_run)
    out_path = tmp_path / "grid.json"
    out = transfer_check.check_grid(tmp_path, out_path)
    for family in transfer_check.EXPERIMENTS:
        fam = out["families"][family]
        assert {v: fam[v]["best"] for v in best} == best
        assert all(fam[v]["closed"] for v in best)
        assert fam["scape90"]["over_adams"] == 64.0 and fam["scape90"]["over_adamw"] == 8.0
        # every multiplier run on every seed, none twice
        assert all(len(x) == len(transfer_check.SEEDS) for x in fam["adams"]["losses"].values())
    assert len(calls) == len(set(calls))
    assert json.loads(out_path.read_text()) == out
    # a second call finds every run in the file and makes none
    calls.clear()
    transfer_check.check_grid(tmp_path, out_path)
    assert calls == []


def test_the_grid_text_marks_each_best_and_sets_the_ratio_beside_the_studys():
    grid = {"seeds": [1, 2], "metric": "m", "setting": "s", "families": {"llama": {
        "adams": {"losses": {"0.5": [3.0, 3.2], "1": [3.5, 3.5]}, "best": 0.5, "closed": True},
        "scape90": {"losses": {"1": [3.4, 3.4], "2": [3.3, 3.3], "4": [3.6]}, "best": 2.0,
                    "closed": True, "over_adams": 4.0, "over_adamw": 2.0}}}}  # fmt: skip
    text = transfer_check.grid_text(grid, {"llama": {"scape90": 1.0}})
    assert "| llama | scape90 | x1 3.400, **x2 3.300**, x4 3.600 (n=1) | x2 | x4 | x2 |" in text
    assert "**x0.5 3.100**" in text
    assert "scape90 on llama: x4 dense AdamS's best here, x1 in the study's setting" in text
