"""The peers study's report: seed statistics, the bytes curve, and time to target."""

import pytest

from pipelines.studies.peers_report import _attach_times, _table, summarize_method


def _records(losses: dict[int, float], bytes_per_step: float, steps: int) -> list[dict]:
    out = []
    for step in range(1, steps + 1):
        r = {
            "step": step,
            "loss": 9.0,
            "bytes": {"grad_values": bytes_per_step / 2, "masks": bytes_per_step / 2},
        }
        if step in losses:
            r["val_loss"] = losses[step]
        out.append(r)
    return out


def test_seed_mean_spread_and_bytes_curve():
    runs = [_records({2: 5.0, 4: 4.0}, 100.0, 4), _records({2: 6.0, 4: 5.0}, 100.0, 4)]
    r = summarize_method("dgc99", "DGC-99", runs)
    assert r.seeds == 2 and r.final_val_loss == pytest.approx(4.5)
    assert r.final_val_loss_std == pytest.approx(0.7071, abs=1e-4)
    assert r.bytes_per_step == pytest.approx(100.0)
    assert r.eval_steps == [2, 4] and r.curve == [(200.0, 5.5), (400.0, 4.5)]


def test_a_diverged_seed_is_counted_and_left_out_of_the_mean():
    nan = float("nan")
    runs = [_records({2: 5.0, 4: 4.0}, 10.0, 4), _records({2: 9.0, 4: nan}, 10.0, 4)]
    r = summarize_method("onebit", "1-bit-Adam", runs)
    assert (r.seeds, r.diverged, r.final_val_loss, r.curve) == (
        2,
        1,
        4.0,
        [(20.0, 5.0), (40.0, 4.0)],
    )
    all_nan = summarize_method("onebit", "1-bit-Adam", [_records({4: nan}, 10.0, 4)])
    assert (
        all_nan.diverged == 1
        and all_nan.curve == []
        and all_nan.final_val_loss != all_nan.final_val_loss
    )


def test_time_to_target_uses_the_cluster_step_time_or_says_never():
    ref = summarize_method("adams", "AdamS", [_records({2: 5.0, 4: 4.0}, 1000.0, 4)])
    fast = summarize_method("scape99", "SCAPE-99", [_records({2: 3.9, 4: 3.5}, 10.0, 4)])
    slow = summarize_method("dgc99", "DGC-99", [_records({2: 6.0, 4: 4.5}, 10.0, 4)])
    cluster = {
        "link": {"label": "1gbit"},
        "methods": {"adams": {"step_time_s": 0.5}, "scape99": {"step_time_s": 0.1}},
    }
    _attach_times([ref, fast, slow], [cluster])
    assert (ref.steps_to_target, ref.time_to_target_s) == (4, {"1gbit": 2.0})
    assert fast.steps_to_target == 2 and fast.time_to_target_s["1gbit"] == pytest.approx(0.2)
    assert slow.steps_to_target is None and slow.time_to_target_s == {}
    assert "never" in _table([ref, fast, slow], ["1gbit"]).splitlines()[-1]


# ---------------------------------------------------------------- the frontier


def _fake_run(root, method, label, lr, seed, final, *, steps=4, bytes_per_step=100.0,
              commit="abc1234567890", dirty=False, recorded=None):  # fmt: skip
    """A finished StudyRun on disk: summary.json, metrics.jsonl and provenance.json."""
    import json
    from types import SimpleNamespace

    from pipelines.studies.peers_report import StudyRun

    run_dir = root / f"{label}-lr{lr:g}-seed{seed}"
    run_dir.mkdir(parents=True)
    records = _records({steps: final}, bytes_per_step, steps)
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    summary = {"status": "finished", "step": steps, "final_val_loss": final}
    if recorded is not None:  # the optimizer config the run recorded: (lr, lr_multiplier)
        summary["config"] = {"optimizer": {"lr": recorded[0], "lr_multiplier": recorded[1]}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "provenance.json").write_text(json.dumps({"commit": commit, "dirty": dirty}))
    opt = SimpleNamespace(scaled=lambda: {"lr": 6e-4 * lr})
    cfg = SimpleNamespace(train=SimpleNamespace(train_steps=steps), optimizer=opt)
    return StudyRun(method, label, lr, seed, run_dir, cfg)


SETTING = {
    "experiment": "peers_gpt345m_owt", "scale": "tiny", "model": "tiny_gpt", "params": 1_000_000,
    "vocab": 1024, "tokenizer": "bytebpe1k", "data": "data/x", "steps": 4, "warmup_steps": 1,
    "ranks": 2, "tokens_per_step": 1024, "lr": 6e-4, "seeds": [1, 2], "lr_scales": [1.0, 2.0],
    "overrides": [],
    "paper_shapes": [{"name": "GPT-345M", "shape": "gpt-345m", "params": 355_000_000,
                      "world_size": 32}],
}  # fmt: skip


def _doc(tmp_path, runs_spec, **kw):
    from pipelines.studies.peers_report import frontier

    runs = [_fake_run(tmp_path, *spec) for spec in runs_spec]
    doc = frontier(
        runs, code={"version": "v1", "current": "v1", "other_versions": {}}, setting=SETTING,
        unigram={"nats": 6.0, "tokens": 1000, "split": "train", "data": "data/x"},
        projections={"adams": {"GPT-345M": 2.8e9}, "dgc99": {"GPT-345M": 8.8e8}},
        formula_here={"adams": 1000.0, "dgc99": 10.0}, command="cmd", **kw,
    )  # fmt: skip
    return runs, doc


def test_frontier_pairs_gaps_by_seed_at_each_methods_chosen_lr(tmp_path):
    nan = float("nan")
    _, doc = _doc(tmp_path, [
        ("adams", "AdamS", 1.0, 1, 5.0), ("adams", "AdamS", 1.0, 2, 5.2),
        ("adams", "AdamS", 2.0, 1, 4.0), ("adams", "AdamS", 2.0, 2, 4.4),  # x2 wins, at the edge
        ("dgc99", "DGC-99", 1.0, 1, 4.4), ("dgc99", "DGC-99", 1.0, 2, 4.4),
        ("dgc99", "DGC-99", 2.0, 1, 3.0), ("dgc99", "DGC-99", 2.0, 2, nan),  # diverged: not chosen
        ("dgc99", "DGC-99", 0.5, 1, 4.8), ("dgc99", "DGC-99", 0.5, 2, 4.8),
    ])  # fmt: skip
    adams, dgc = doc["methods"]
    assert (adams["lr_scale"], adams["closed"], adams["grid"]) == (2.0, False, [1.0, 2.0])
    assert adams["lr"] == pytest.approx(1.2e-3)
    assert (dgc["lr_scale"], dgc["closed"]) == (1.0, True)  # x2's mean is inf, x0.5's is worse
    assert dgc["gap_pct"]["per_seed"] == {"1": pytest.approx(10.0), "2": pytest.approx(0.0)}
    assert dgc["gap_pct"]["mean"] == pytest.approx(5.0) and dgc["gap_pct"]["max"] == pytest.approx(
        10.0
    )
    assert adams["final"]["mean"] == pytest.approx(4.2) and adams["final"]["diverged"] == 0
    assert dgc["runs"] == ["DGC-99-lr1-seed1", "DGC-99-lr1-seed2"]
    assert doc["code"]["commits"] == [{"commit": "abc1234567890", "dirty": False, "runs": 4}]


def test_the_frontiers_lr_is_the_one_the_run_recorded(tmp_path):
    """A config changed after the runs (a recipe's new multiplier) does not change the lr the
    frontier reports: it is read off each run's own summary."""
    from pipelines.studies.peers_report import frontier

    runs = [_fake_run(tmp_path, "adams", "AdamS", 1.0, s, 5.0, recorded=(6e-4, 1.0))
            for s in (1, 2)]  # fmt: skip
    for run in runs:  # planned today at twice the lr
        run.cfg.optimizer.scaled = lambda: {"lr": 1.2e-3}
    doc = frontier(runs, code={"version": "v1", "current": "v1", "other_versions": {}},
                   setting=SETTING, unigram={"nats": 6.0, "tokens": 1000, "split": "train",
                                             "data": "data/x"},
                   projections={"adams": {"GPT-345M": 2.8e9}}, formula_here={"adams": 1000.0},
                   command="cmd")  # fmt: skip
    assert doc["methods"][0]["lr"] == 6e-4


def test_an_unfinished_run_is_not_counted(tmp_path):
    from pipelines.studies.peers_report import final_val_loss, lr_choices

    runs, _ = _doc(tmp_path, [("adams", "AdamS", 1.0, 1, 5.0), ("adams", "AdamS", 2.0, 1, 4.0)])
    (runs[1].run_dir / "summary.json").write_text('{"status": "preempted", "step": 2}')
    assert final_val_loss(runs[1]) is None
    assert lr_choices(runs)["adams"].grid == (1.0,)


def test_frontier_prose_reads_every_figure_from_the_json(tmp_path):
    """Change the JSON's values and the table and caption print the changed figures."""
    import copy

    from pipelines.studies.peers_report import frontier_block, frontier_caption, frontier_table

    _, doc = _doc(tmp_path, [
        ("adams", "AdamS", 1.0, 1, 5.0), ("adams", "AdamS", 1.0, 2, 5.2),
        ("dgc99", "DGC-99", 1.0, 1, 5.5), ("dgc99", "DGC-99", 1.0, 2, 5.2),
    ])  # fmt: skip
    text = frontier_table(doc) + frontier_caption(doc)
    assert "+5.00% ± 7.07 (+0.00 to +10.00)" in text and "5.100 ± 0.141 (2)" in text
    assert "6.000 nats/token" in text and "ends 0.90 nats below it" in text
    assert "880.0 MB" in text and "2.8 GB" in text and "x1 (grid open)" in text
    assert "abc1234567: 4 runs" in text and "Incomplete (grid open: AdamS, DGC-99)" in text
    changed = copy.deepcopy(doc)
    changed["unigram"]["nats"] = 7.25
    changed["setting"].update(steps=1234, params=2_345_678, seeds=[1, 2, 3])
    d = changed["methods"][1]
    d["gap_pct"].update(mean=3.21, sd=0.5, min=2.5, max=4.75)
    d["bytes"]["projected"]["GPT-345M"] = 4.56e8
    d["bytes"]["measured_mean"] = 12_345.0
    changed["methods"][0]["final"]["mean"] = 6.5
    changed["code"]["commits"] = [{"commit": "fedcba9876543", "dirty": True, "runs": 7}]
    text = frontier_table(changed) + frontier_caption(changed)
    for figure in ("+3.21% ± 0.50 (+2.50 to +4.75)", "7.250 nats/token", "ends 0.75 nats below",
                   "456.0 MB", "12.3 kB", "1,234 steps", "2,345,678 parameters",
                   "fedcba9876 (uncommitted changes): 7 runs", "fewer than 3 seeds"):  # fmt: skip
        assert figure in text, figure
    for stale in ("+5.00%", "6.000 nats", "880.0 MB", "abc1234567"):
        assert stale not in text, stale
    assert frontier_block(changed).startswith("![")


def test_frontier_figure_is_drawn(tmp_path):
    from pipelines.studies.peers_figures import plot_frontier

    _, doc = _doc(tmp_path, [("adams", "AdamS", 1.0, 1, 5.0), ("dgc99", "DGC-99", 1.0, 1, 5.5)])
    plot_frontier(doc, tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 10_000


def test_report_fills_the_readme_block_only_once_there_is_a_result(tmp_path):
    from pipelines.studies.peers_report import report

    readme = tmp_path / "README.md"
    readme.write_text(
        "# Peers\n<!-- frontier:begin -->\nnot run yet\n<!-- frontier:end -->\ntail\n"
    )
    kw = dict(code={"version": "v1", "current": "v1", "other_versions": {}}, setting=SETTING,
              unigram={"nats": 6.0, "tokens": 1000, "split": "train", "data": "data/x"},
              projections={}, formula_here={}, readme=readme)  # fmt: skip
    pending = [_fake_run(tmp_path / "a", "adams", "AdamS", 1.0, 1, 5.0)]
    (pending[0].run_dir / "summary.json").unlink()
    report(pending, tmp_path / "out1", [], "cmd", **kw)
    assert "not run yet" in readme.read_text()
    done = [_fake_run(tmp_path / "b", "adams", "AdamS", 1.0, 1, 5.0)]
    report(done, tmp_path / "out2", [], "cmd", **kw)
    text = readme.read_text()
    assert "not run yet" not in text and "![gap to dense AdamS" in text and text.endswith("tail\n")
    assert {p.name for p in (tmp_path / "out2").iterdir()} >= {
        "frontier.json", "frontier.md", "frontier.png", "peers.md", "loss_vs_bytes.png"
    }  # fmt: skip


def test_the_frontier_rewrites_from_its_json_alone(tmp_path):
    """A wording change needs no run: frontier.md and the README block come back from the
    committed frontier.json, the bytes labelled as counted at the collectives."""
    import shutil
    from pathlib import Path

    from pipelines.studies.peers_report import rewrite_frontier

    committed = Path(__file__).resolve().parents[3] / "results" / "peers"
    shutil.copy(committed / "frontier.json", tmp_path / "frontier.json")
    readme = tmp_path / "README.md"
    readme.write_text("# P\n<!-- frontier:begin -->\nold\n<!-- frontier:end -->\n")
    rewrite_frontier(tmp_path, readme)
    table = (tmp_path / "frontier.md").read_text()
    assert "bytes/rank/step, counted" in table and "not a capture of the wire" in table
    assert (tmp_path / "frontier.png").stat().st_size > 0
    assert "bytes/rank/step, counted" in readme.read_text()
