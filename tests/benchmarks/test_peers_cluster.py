"""`make bench-peers-cluster`: the summary on synthetic runs, the skip record, and a real
2-rank run of the pretrain stage on loopback (dense AdamS against DGC-99)."""

import json
import math

import pytest

from benchmarks import peers_cluster
from benchmarks.harness import netns
from benchmarks.peers_cluster import overrides_for, run_stats, summarize

# The machine may be shared (studies, other tests): these check function, not speed.
QUIET_OFF = ["--allow-busy", "--retries", "0", "--settle-s", "0"]


def _run(method, repeat, step_time_s, nbytes, **extra):
    return {"method": method, "repeat": repeat, "step_time_s": step_time_s, "step_time_s_min": step_time_s * 0.9,
            "bytes_per_rank_step": nbytes, "loadavg": [1.0, 1.5], **extra}  # fmt: skip


def test_summary_medians_and_same_repeat_ratios():
    runs = [
        _run("adams", 0, 0.40, 4000.0), _run("dgc99", 0, 0.20, 80.0),
        _run("adams", 1, 0.80, 4000.0), _run("dgc99", 1, 0.60, 80.0),
        _run("adams", 2, 0.50, 4000.0), _run("dgc99", 2, 0.50, 100.0),
        {"method": "powersgd_r1", "repeat": 0, "error": "gloo mismatch", "loadavg": [1, 1]},
    ]  # fmt: skip
    s = summarize(runs)
    adams, dgc, psgd = (s["methods"][m] for m in ("adams", "dgc99", "powersgd_r1"))
    assert s["reference"] == "adams"
    assert adams["step_time_s"] == 0.50 and adams["step_ratio_vs_adams"] == 1.0
    assert dgc["step_time_s"] == 0.50  # median of per-run medians 0.2, 0.6, 0.5
    assert dgc["step_time_s_runs"] == [0.20, 0.60, 0.50]
    # Same-repeat ratios 0.5, 0.75, 1.0 -> 0.75; not 0.50 / 0.50 of the medians.
    assert dgc["step_ratio_vs_adams"] == pytest.approx(0.75)
    assert dgc["step_ratio_vs_adams_runs"] == pytest.approx([0.5, 0.75, 1.0])
    assert dgc["speedup_vs_adams"] == pytest.approx(4 / 3)  # median of 2, 4/3, 1
    assert dgc["bytes_per_rank_step"] == 80.0 and dgc["bytes_ratio"] == pytest.approx(50.0)
    assert dgc["step_time_s_min"] == pytest.approx(0.18)
    assert dgc["runs"] == dgc["runs_ok"] == 3 and dgc["errors"] == []
    assert psgd["runs"] == 1 and psgd["runs_ok"] == 0 and psgd["errors"] == ["gloo mismatch"]
    assert psgd["step_time_s"] is None and psgd["step_ratio_vs_adams"] is None


def test_summary_without_reference_in_a_repeat():
    s = summarize([_run("adams", 0, 0.4, 10.0), _run("dgc99", 1, 0.2, 1.0)])
    assert s["methods"]["dgc99"]["step_ratio_vs_adams"] is None  # adams not in repeat 1
    assert s["methods"]["dgc99"]["bytes_ratio"] == 10.0


def test_run_stats_skips_warmup_steps():
    rank0 = {"step_time": [5.0, 4.0, 0.3, 0.1, 0.2], "bytes": [9.0, 9.0, 1.0, 3.0, 2.0],
             "bytes_by_kind": [{"a": 9.0}] * 2 + [{"a": 1.0}, {"a": 3.0}, {"a": 2.0}],
             "loss": [3.0, 2.5, 2.0, 1.9, 1.8]}  # fmt: skip
    st = run_stats(rank0, skip=2)
    assert st["step_time_s"] == 0.2 and st["step_time_s_min"] == 0.1 and st["measured_steps"] == 3
    assert st["bytes_per_rank_step"] == 2.0 and st["bytes_by_kind"] == {"a": 2.0}
    assert st["loss_last"] == 1.8
    with pytest.raises(ValueError, match="no measured steps"):
        run_stats(rank0, skip=5)


def test_overrides_keep_eval_and_checkpoints_out_of_the_measured_steps(tmp_path):
    from pipelines.training.config import compose

    ov = overrides_for("onebit", steps=12, warmup=5, world=2, output_root=tmp_path,
                       data_root=tmp_path)  # fmt: skip
    cfg = compose(ov)
    t = cfg.train
    assert (t.train_steps, t.warmup_steps, t.eval_interval, t.checkpoint_interval) == (
        12,
        5,
        12,
        12,
    )
    assert cfg.optimizer.onebit.freeze_step == 5 and cfg.scale == "tiny"
    assert cfg.wandb.mode == "disabled" and cfg.progress is False
    assert cfg.cluster.world_size == 2 and cfg.train.precision == "fp32"


def test_default_methods_are_the_experiment_sweep():
    assert peers_cluster.default_methods() == [
        "adams", "scape90", "scape99", "powersgd_r1", "powersgd_r2", "powersgd_r4",
        "dgc90", "dgc99", "onebit",
    ]  # fmt: skip


def test_writes_skip_record(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(netns, "skip_reason", lambda: "not root: test")
    out = tmp_path / "cluster.json"
    assert peers_cluster.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"skipped": "not root: test"}
    assert "SKIPPED: not root: test" in capsys.readouterr().out


def test_loopback_run_adams_vs_dgc99(tmp_path, capsys, prepared_default):
    """The real pretrain stage, 2 gloo ranks on 127.0.0.1, 4 steps of each method."""
    out = tmp_path / "cluster.json"
    argv = ["--loopback", "--methods", "adams", "dgc99", "--steps", "4", "--warmup-steps", "1",
            "--skip", "1", "--repeats", "1", "--timeout", "300", "--out", str(out),
            *QUIET_OFF]  # fmt: skip
    assert peers_cluster.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "loopback" and doc["link"]["rate_mbit"] is None and doc["world_size"] == 2
    assert [r["method"] for r in doc["runs"]] == ["adams", "dgc99"]
    for r in doc["runs"]:
        assert "error" not in r, r.get("error")
        assert r["measured_steps"] == 3 and len(r["step_time_s_all"]) == 4
        assert all(t > 0 and math.isfinite(t) for t in r["step_time_s_all"])
        assert r["step_time_s"] > 0 and r["loadavg"][0] >= 0
    m = doc["methods"]
    assert m["adams"]["step_time_s"] > 0 and m["dgc99"]["step_time_s"] > 0
    assert m["dgc99"]["bytes_per_rank_step"] > 0
    assert m["dgc99"]["bytes_per_rank_step"] < m["adams"]["bytes_per_rank_step"] / 20
    assert m["dgc99"]["step_ratio_vs_adams"] > 0 and m["adams"]["step_ratio_vs_adams"] == 1.0
    assert "wrote" in capsys.readouterr().out


def test_a_crashing_method_is_recorded_and_the_sweep_goes_on(monkeypatch, tmp_path, capsys):
    from benchmarks.harness.launch import LaunchError
    from benchmarks.harness.workers import pretrain_worker

    def fake_launch(worker, spec, out_dir, *, world_size, cluster=None, timeout_s):
        assert worker is pretrain_worker and cluster is None
        out_dir.mkdir(parents=True, exist_ok=True)
        if "optimizer=powersgd_r1" in spec["overrides"]:
            (out_dir / "rank0.log").write_text(
                "Traceback\nRuntimeError: Connection reset by peer\n"
            )
            (out_dir / "rank1.log").write_text(
                "what():  Is there a distributed collective mismatch\n"
            )
            raise LaunchError("rank 0 exited with 1:\n...")
        n = 2.0 if "optimizer=adams" in spec["overrides"] else 1.0
        return [{"step_time": [1.0, n], "bytes": [5.0, 100 * n], "loss": [1.0, 0.5],
                 "seconds": 3.0, "train_seconds": 2.0}, {"rank": 1}]  # fmt: skip

    monkeypatch.setattr(peers_cluster, "launch_ranks", fake_launch)
    out = tmp_path / "c.json"
    argv = ["--loopback", "--methods", "adams", "powersgd_r1", "dgc99", "--steps", "2",
            "--warmup-steps", "1", "--skip", "1", "--repeats", "2", "--out", str(out),
            *QUIET_OFF]  # fmt: skip
    assert peers_cluster.main(argv) == 0
    doc = json.loads(out.read_text())
    order = [r["method"] for r in doc["runs"]]
    assert order == ["adams", "powersgd_r1", "dgc99", "powersgd_r1", "dgc99", "adams"]
    m = doc["methods"]
    assert m["powersgd_r1"]["runs_ok"] == 0 and len(m["powersgd_r1"]["errors"]) == 2
    err = m["powersgd_r1"]["errors"][0]
    assert "rank 0 exited" in err and "collective mismatch" in err and "Connection reset" in err
    assert m["dgc99"]["step_ratio_vs_adams"] == 0.5 and m["dgc99"]["bytes_ratio"] == 2.0
    assert "FAILED" in capsys.readouterr().out
    # What the peers study reads from this file: methods.<name>.step_time_s and link.label.
    from pipelines.studies.peers_report import _attach_times, summarize_method

    recs = [{"step": 1, "loss": 1.0, "val_loss": 2.0, "bytes": {"grad_values": 1.0}}]
    results = [summarize_method(n, n, [recs]) for n in ("adams", "dgc99", "powersgd_r1")]
    _attach_times(results, [doc])
    link = doc["link"]["label"]
    assert link.startswith("loopback")
    assert [r.step_time_s.get(link) for r in results] == [2.0, 1.0, None]
