"""The early-gap study's reading (pipelines/studies/early_gap.py): lr chosen on validation,
every gap read on test, SCAPE at its multiplier x dense AdamS's choice, the byte budget."""

from __future__ import annotations

import pytest

from pipelines.studies.early_gap import CANDIDATES, arm_result, report
from pipelines.studies.run_index import RunIndex, RunLog

BY_NAME = {c.name: c for c in CANDIDATES}


def _run(
    model, variant, lr, seed, val, test, *, steps=100, run_bytes=None, bytes_=10.0, warmup=None
):
    header = {"model": model, "variant": variant, "seed": seed, "steps": steps, "lr_scale": lr,
              "params": 1000, "code": {"commit": "c", "dirty": False, "step_code": "v"}}  # fmt: skip
    if warmup is not None:
        header["settings"] = {"variant": {"options": {"dense_warmup_steps": warmup}}}
    curve = [{"step": s, "loss": 0.0, "bytes": 1000.0 if variant in ("adams", "adamw") else bytes_,
              "val_loss": 6.0 + (val - 6.0) * s / steps} for s in range(10, steps + 1, 10)]  # fmt: skip
    final = {"event": "final", "final_val_loss": val, "final_test_loss": test, "diverged": False}
    if run_bytes is not None:
        final["run_bytes"] = run_bytes
    return RunLog(header, curve, final)


def _runs(scape_test=4.03, ramp_bytes=None):
    runs = []
    for seed in (0, 1, 2):
        # AdamS: x1 best on validation (closed), though x2 would be best on test
        for lr, val, test in ((0.5, 4.3, 4.3), (1.0, 4.0, 4.1), (2.0, 4.1, 4.0)):
            runs.append(_run("llama", "adams", lr, seed, val, test))
        for lr, val, test in ((0.5, 4.1, 4.1), (1.0, 3.9, 4.0), (2.0, 4.2, 4.2)):
            runs.append(_run("llama", "adamw", lr, seed, val, test))
        runs.append(_run("llama", "scape90", 1.0, seed, 4.0, scape_test))
        runs.append(_run("llama", "scape99_ramp", 2.0, seed, 4.1, 4.2, run_bytes=ramp_bytes))
    return runs


def test_an_arm_runs_at_its_multiplier_of_adams_validation_choice_and_gaps_read_on_test():
    index = RunIndex(_runs())
    arm = arm_result(index, BY_NAME["scape90"], "llama", 100)
    assert arm.lr == 1.0  # x1 AdamS's validation choice (x2 is best on test: not taken)
    assert arm.to_adamw == pytest.approx([0.75] * 3)  # 4.03 against AdamW's x1 test loss 4.0
    assert arm.to_adams == pytest.approx([100 * (4.03 - 4.1) / 4.1] * 3)
    assert arm.bytes_ratio == pytest.approx(1.0) and arm.meets_goal()  # +0.75%: within +1%
    assert not arm_result(RunIndex(_runs(scape_test=4.05)), BY_NAME["scape90"], "llama",
                          100).meets_goal()  # fmt: skip
    # SCAPE-99 ships x2: 4.2 over 4.0 is +5%, outside +3%
    arm99 = arm_result(index, BY_NAME["scape99"], "llama", 100)
    assert arm99.lr == 2.0 and arm99.to_adamw == pytest.approx([5.0] * 3)
    assert arm99.meets_goal() is False
    assert arm_result(index, BY_NAME["scape90_x4"], "llama", 100).meets_goal() is None  # not run


def test_a_ramp_counts_its_whole_runs_bytes_against_a_constant_runs():
    # constant: the dense first step (1,000) and 99 sparse steps at the last logged 10 bytes
    index = RunIndex(_runs(ramp_bytes=1.6 * (1000 + 99 * 10)))
    assert arm_result(index, BY_NAME["scape99"], "llama", 100).bytes_ratio == pytest.approx(1.6)
    # a dense warm-up's: 20 steps at the dense 1,000, 80 at the sparse 10
    warm = [_run("llama", "scape90_w20", 1.0, s, 4.0, 4.0, warmup=20) for s in (0, 1, 2)]
    ratio = arm_result(RunIndex(_runs() + warm), BY_NAME["scape90_w20"], "llama", 100).bytes_ratio
    assert ratio == pytest.approx((20 * 1000 + 80 * 10) / (1000 + 99 * 10))


def test_the_report_writes_its_block_json_and_plot(tmp_path, monkeypatch):
    import json

    index = RunIndex(_runs())
    monkeypatch.setattr(RunIndex, "load", classmethod(lambda cls, out, code=None: index))
    (tmp_path / "README.md").write_text("# head\n<!-- early-gap:begin -->\nold\n"
                                        "<!-- early-gap:end -->\ntail\n")  # fmt: skip
    block = report(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# head\n") and text.endswith("tail\n") and "old" not in text
    # sd 0 over the seeds: +0.75% is outside the floor (behind), though within the goal
    assert ("| 100 | llama | SCAPE-90 as shipped (x1) | x1 | 4.030 | +0.8 ± 0.0% (n=3), behind |"
            in block)  # fmt: skip
    assert "At 100 steps SCAPE-90 as shipped (x1) ends +0.8 ± 0.0% (n=3), behind on llama" in block
    assert "Noise floor: no rerun yet" in block
    assert "some candidates have not run on every model yet" in block  # x2, x4, the ramp
    saved = json.loads((tmp_path / "early_gap.json").read_text())
    assert saved["100"]["llama"]["scape90"]["meets_goal"] is True
    assert (tmp_path / "early_gap_100.png").stat().st_size > 0


def test_a_longer_horizons_dense_grid_centres_on_the_shorter_ones_choice():
    from pipelines.studies.early_gap import DENSE_GRID, dense_grid

    index = RunIndex(_runs())  # 100 steps: AdamS x1, AdamW x1, both closed
    assert dense_grid(index, "llama", "adams", 400) == [0.5, 1.0, 2.0]
    assert dense_grid(index, "llama", "adams", 50) == list(DENSE_GRID)  # none as short
    # a horizon's new seed centres on the choice its other seeds closed (x2 here)
    same = [_run("llama", "adams", lr, 0, val, val, steps=400)
            for lr, val in ((1.0, 4.3), (2.0, 4.0), (4.0, 4.2))]  # fmt: skip
    assert dense_grid(RunIndex(_runs() + same), "llama", "adams", 400) == [1.0, 2.0, 4.0]
    shifted = [r for r in _runs() if not (r.header["variant"] == "adams"
                                          and r.header["lr_scale"] == 0.5)]  # fmt: skip
    # x0.5 gone: AdamS's choice x1 sits at the grid's edge (open): the default grid
    assert dense_grid(RunIndex(shifted), "llama", "adams", 400) == list(DENSE_GRID)


def test_an_unknown_arm_is_named_with_the_choices(tmp_path):
    from pipelines.studies.early_gap import run

    data = tmp_path / "prepared"
    data.mkdir()
    (data / "metadata.json").write_text("{}")
    with pytest.raises(SystemExit, match="--arms scape95: not a candidate; use any of scape90"):
        run(400, [0], tmp_path / "out", str(data), ["llama"], ["scape95"])


def test_the_shipped_arms_carry_the_configs_multipliers_in_every_family():
    from pipelines.studies.early_gap import SHIPPED
    from pipelines.studies.report_shipped import shipped_multipliers

    configs = shipped_multipliers()
    for arm in SHIPPED.values():
        assert set(configs[arm.variant].values()) == {arm.multiplier}, arm.name


def test_the_verdict_names_where_each_shipped_arm_stands_and_the_readme_gets_it(tmp_path,
                                                                                monkeypatch):  # fmt: skip
    from pipelines.studies.early_gap import verdict_text

    def noise_floor_text(index):
        from pipelines.studies.noise_floor import floor_text, hosts

        return floor_text([], hosts(index))

    index = RunIndex(_runs())
    text = verdict_text(index, ["llama"], None, "Floor.")
    # SCAPE-90 4.03 over AdamW's 4.0 on every seed: sd 0, so +0.75% is behind; SCAPE-99 +5%
    assert (
        "| 100 | llama | " in text and "+0.8 ± 0.0% behind" in text and "+5.0 ± 0.0% behind" in text
    )
    assert "Floor." in text and "code version `v`" in text
    readme = tmp_path / "PROJECT.md"
    readme.write_text("a\n<!-- verdict:begin -->\nold\n<!-- verdict:end -->\nb\n")
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(RunIndex, "load", classmethod(lambda cls, out, code=None: index))
    report(tmp_path / "out", verdict_readme=readme)
    written = readme.read_text()
    assert "old" not in written and written.startswith("a\n") and written.endswith("b\n")
    assert verdict_text(index, ["llama"], None, noise_floor_text(index)) in written
    assert (tmp_path / "out" / "shipped_curves.png").stat().st_size > 0


def test_a_verdict_cell_short_of_the_protocols_seeds_says_how_many_it_has():
    from pipelines.studies.early_gap import verdict_text

    # a longer horizon still running: seed 0 at 200 steps, and seed 1 of AdamW's grid
    runs = _runs()
    for seed in (0, 1):
        runs += [_run("llama", "adamw", lr, seed, val, 4.0, steps=200)
                 for lr, val in ((0.5, 4.1), (1.0, 3.9), (2.0, 4.2))]  # fmt: skip
    runs += [_run("llama", "adams", lr, 0, val, 4.1, steps=200)
             for lr, val in ((0.5, 4.3), (1.0, 4.0), (2.0, 4.1))]  # fmt: skip
    runs.append(_run("llama", "scape90", 1.0, 0, 4.0, 4.04, steps=200))
    row = next(r for r in verdict_text(RunIndex(runs), ["llama"], None, "F.").splitlines()
               if r.startswith("| 200 |"))  # fmt: skip
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # AdamS vs AdamW, SCAPE-90 vs AdamW and vs AdamS: one seed each, no sd and no standing
    assert cells[2:5] == ["+2.5% (n=1)", "+1.0% (n=1)", "-1.5% (n=1)"]
    assert cells[5:7] == ["-", "-"]  # SCAPE-99 has not run at 200 steps


def test_a_rerun_needs_stored_runs_first(tmp_path):
    from pipelines.studies.early_gap import rerun

    with pytest.raises(SystemExit, match="no runs of code version .* to rerun; run the study"):
        rerun(tmp_path, "data/x", ["llama"])


def test_steps_to_adamws_loss_are_read_off_the_longer_run_where_the_horizons_falls_short():
    longer = [_run(m.header["model"], m.header["variant"], m.header["lr_scale"], m.header["seed"],
                   m.final["final_val_loss"], m.final["final_test_loss"], steps=200)
              for m in _runs() if m.header["variant"] in ("adams", "adamw")]  # fmt: skip
    # SCAPE-90's 200-step run ends at 3.8: its curve first meets AdamW's 100-step 3.9 at step 200
    longer += [_run("llama", "scape90", 1.0, s, 3.8, 3.9, steps=200) for s in (0, 1, 2)]
    index = RunIndex(_runs() + longer)
    arm = arm_result(index, BY_NAME["scape90"], "llama", 100)
    assert arm.target.ratio == pytest.approx(2.0) and arm.target.read_at == 200
    short = arm_result(RunIndex(_runs()), BY_NAME["scape90"], "llama", 100)
    assert short.target.ratio is None  # its own 4.0 never reaches 3.9, and no longer run


def test_scapes_best_lr_over_adams_is_read_on_validation_over_every_multiplier_run():
    from pipelines.studies.early_gap import study_ratios

    runs = _runs()
    for seed in (0, 1, 2):  # x4 beats x1 on validation though not on test
        runs.append(_run("llama", "scape90", 4.0, seed, 3.9, 4.5))
    ratios = study_ratios(RunIndex(runs))
    assert ratios["llama"] == {"scape90": 4.0, "scape99": 2.0}


def test_the_study_runs_adamws_grid_beside_adams_and_the_candidates_once_adams_closed(
    tmp_path, monkeypatch
):
    import threading

    from pipelines.studies import early_gap

    index = RunIndex(_runs())  # AdamS's grid closed at x1 (100 steps)
    monkeypatch.setattr(RunIndex, "load", classmethod(lambda cls, out, code=None: index))
    monkeypatch.setattr(early_gap, "code_version", lambda repo: {"step_code": "v"})
    (tmp_path / "metadata.json").write_text("{}")
    lock, running, events = threading.Lock(), [0], []
    adamw_started = threading.Event()

    def fake_study(model, steps, seeds, out, data, variants, lrs, close_grids):
        with lock:
            running[0] += 1
            events.append(("start", variants[0], tuple(lrs), close_grids, running[0]))
        if variants == ["adamw"]:
            adamw_started.set()
        if variants == ["adams"]:  # AdamW's grid must start while AdamS's still runs
            assert adamw_started.wait(10), "AdamW's grid waited for AdamS's"
        with lock:
            running[0] -= 1
            events.append(("end", variants[0]))

    monkeypatch.setattr(early_gap, "_study", fake_study)
    early_gap.run(100, [0, 1, 2], tmp_path, str(tmp_path), ["llama"], ["scape90", "scape99"],
                  jobs=2)  # fmt: skip
    starts = {e[1]: e for e in events if e[0] == "start"}
    assert set(starts) == {"adams", "adamw", "scape90", "scape99_ramp"}  # one process each
    assert starts["adams"][2:4] == ((0.5, 1.0, 2.0), 4) and starts["adamw"][3] == 4
    # each SCAPE arm at its multiplier of AdamS's x1, with no grid of its own
    assert starts["scape90"][2:4] == ((1.0,), 0) and starts["scape99_ramp"][2:4] == ((2.0,), 0)
    assert max(e[4] for e in events if e[0] == "start") <= 2  # never more than --jobs
    adams_end = events.index(("end", "adams"))
    assert all(events.index(starts[v]) > adams_end for v in ("scape90", "scape99_ramp"))
    with pytest.raises(SystemExit, match="--jobs 0: must be at least 1"):
        early_gap.run(100, [0], tmp_path, str(tmp_path), ["llama"], jobs=0)


def test_each_host_class_keeps_its_reruns_and_the_floor_spans_them_all(tmp_path, monkeypatch):
    from pipelines.studies.early_gap import host_dir, rerun_pairs

    assert host_dir("AMD EPYC, AVX-512") == "amd-epyc-avx-512"
    assert host_dir("Intel(R) Xeon(R) Gold, AVX2") == "intel-r-xeon-r-gold-avx2"

    def on(cpu, test):
        run = _run("llama", "adams", 1.0, 0, 4.0, test)
        run.header["host"] = {"cpu": cpu}
        return RunIndex([run])

    stored = on("AMD EPYC, AVX-512", 4.0)
    again = {
        "amd-epyc-avx-512": on("AMD EPYC, AVX-512", 4.0),
        "amd-epyc-avx2": on("AMD EPYC, AVX2", 4.02),
    }
    for name in again:
        (tmp_path / "reruns" / name / "runs").mkdir(parents=True)
    monkeypatch.setattr(RunIndex, "load", classmethod(lambda cls, out, code=None: again[out.name]))
    found = rerun_pairs(tmp_path, stored)
    assert [r.rerun_cpu for r in found] == ["AMD EPYC, AVX-512", "AMD EPYC, AVX2"]
    assert max(r.spread for r in found) == pytest.approx(0.5)  # the other class's 4.02 vs 4.0
    assert rerun_pairs(tmp_path / "none", stored) == []
