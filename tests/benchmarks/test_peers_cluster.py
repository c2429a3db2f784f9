"""`make bench-peers-cluster`: the summary on synthetic runs, the skip record, and a real
2-rank run of the pretrain stage on loopback (dense AdamS against DGC-99)."""

import json
import math

import pytest

from benchmarks import peers_cluster
from benchmarks.harness import netns
from benchmarks.peers_cluster import overrides_for, summarize

# The machine may be shared (studies, other tests): these check function, not speed.
QUIET_OFF = ["--allow-busy", "--retries", "0", "--settle-s", "0"]


def _run(method, repeat, step_time_s, nbytes, **extra):
    return {"method": method, "repeat": repeat, "step_time_s": step_time_s,
            "bytes_per_rank_step": nbytes, **extra}  # fmt: skip


def test_summary_medians_and_same_repeat_ratios():
    runs = [
        _run("adams", 0, 0.40, 4000.0), _run("dgc99", 0, 0.20, 80.0),
        _run("adams", 1, 0.80, 4000.0), _run("dgc99", 1, 0.60, 80.0),
        _run("adams", 2, 0.50, 4000.0), _run("dgc99", 2, 0.50, 100.0),
        {"method": "powersgd_r1", "repeat": 0, "error": "gloo mismatch"},
    ]  # fmt: skip
    s = summarize(runs)
    adams, dgc, psgd = (s["methods"][m] for m in ("adams", "dgc99", "powersgd_r1"))
    assert s["reference"] == "adams"
    assert adams["step_time_s"] == 0.50 and adams["step_ratio_vs_adams"] == 1.0
    assert dgc["step_time_s"] == 0.50  # median of per-run medians 0.2, 0.6, 0.5
    assert dgc["step_time_s_runs"] == [0.20, 0.60, 0.50]
    # Same-repeat ratios 0.5, 0.75, 1.0 -> 0.75; not 0.50 / 0.50 of the medians.
    assert dgc["step_ratio_vs_adams"] == pytest.approx(0.75)
    assert dgc["bytes_per_rank_step"] == 80.0
    assert dgc["runs"] == dgc["runs_ok"] == 3 and dgc["errors"] == []
    assert psgd["runs"] == 1 and psgd["runs_ok"] == 0 and psgd["errors"] == ["gloo mismatch"]
    assert psgd["step_time_s"] is None and psgd["step_ratio_vs_adams"] is None


def test_summary_without_reference_in_a_repeat():
    s = summarize([_run("adams", 0, 0.4, 10.0), _run("dgc99", 1, 0.2, 1.0)])
    assert s["methods"]["dgc99"]["step_ratio_vs_adams"] is None  # adams not in repeat 1


def test_overrides_run_the_experiment_at_tiny_scale_with_a_short_warm_up(tmp_path):
    from pipelines.training.config import compose

    cfg = compose(
        overrides_for("onebit", warmup=5, world=2, output_root=tmp_path, data_root=tmp_path)
    )
    assert cfg.train.warmup_steps == 5 and cfg.optimizer.onebit.freeze_step == 5
    assert cfg.scale == "tiny" and cfg.wandb.mode == "disabled" and cfg.progress is False
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


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_loopback_run_adams_vs_dgc99(tmp_path, capsys, prepared_default):
    """The pretrain stage's engines, 2 gloo ranks on 127.0.0.1, 4 steps of each method."""
    out = tmp_path / "cluster.json"
    argv = ["--loopback", "--methods", "adams", "dgc99", "--steps", "4", "--warmup-steps", "1",
            "--skip", "1", "--repeats", "1", "--timeout", "300", "--out", str(out),
            *QUIET_OFF]  # fmt: skip
    assert peers_cluster.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["link"]["rate_mbit"] is None and doc["world_size"] == 2
    assert [r["method"] for r in doc["runs"]] == ["adams", "dgc99"]
    for r in doc["runs"]:
        assert "error" not in r, r.get("error")
        assert len(r["step_time_s_all"]) == 3  # the first step left out
        assert all(t > 0 and math.isfinite(t) for t in r["step_time_s_all"])
        assert r["step_time_s"] > 0 and r["quiet"]["load_before"] >= 0
    m = doc["methods"]
    assert m["adams"]["step_time_s"] > 0 and m["dgc99"]["step_time_s"] > 0
    assert 0 < m["dgc99"]["bytes_per_rank_step"] < m["adams"]["bytes_per_rank_step"] / 20
    assert m["dgc99"]["step_ratio_vs_adams"] > 0 and m["adams"]["step_ratio_vs_adams"] == 1.0
    assert "wrote" in capsys.readouterr().out


def test_a_crashing_method_is_recorded_and_the_sweep_goes_on(monkeypatch, tmp_path, capsys):
    from benchmarks.harness.launch import LaunchError
    from benchmarks.harness.step import step_worker

    def fake_launch(worker, spec, out_dir, *, world_size, cluster=None, timeout_s):
        assert worker is step_worker and cluster is None
        out_dir.mkdir(parents=True, exist_ok=True)
        (method,) = spec["methods"]
        if method["name"] == "powersgd_r1":
            (out_dir / "rank0.log").write_text(
                "Traceback\nRuntimeError: Connection reset by peer\n"
            )
            (out_dir / "rank1.log").write_text(
                "what():  Is there a distributed collective mismatch\n"
            )
            raise LaunchError("rank 0 exited with 1:\n...")
        n = 2.0 if method["name"] == "adams" else 1.0
        info = dict.fromkeys(
            (
                "optimizer",
                "model",
                "n_params",
                "buckets",
                "value_collectives",
                "overlap_grad_reduce",
                "values_in_grad_sync",
                "tokens_per_rank_step",
            ),
            0,
        )
        row = {"method": method["name"], "step": 1, "measured": True, "seconds": n,
               "bytes": {"grad_values": 100 * n}, "loss": 0.5}  # fmt: skip
        return [
            {"methods": {method["name"]: {**info, "label": method["name"]}}, "steps": [row]}
        ] * 2

    monkeypatch.setattr(peers_cluster, "launch_ranks", fake_launch)
    monkeypatch.setattr(peers_cluster, "prepare_data", lambda methods: None)
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
    assert m["dgc99"]["step_ratio_vs_adams"] == 0.5 and m["dgc99"]["bytes_per_rank_step"] == 100
    assert "FAILED" in capsys.readouterr().out
    # What the peers study reads from this file: methods.<name>.step_time_s and link.label.
    from pipelines.studies.peers_report import _attach_times, summarize_method

    recs = [{"step": 1, "loss": 1.0, "val_loss": 2.0, "bytes": {"grad_values": 1.0}}]
    results = [summarize_method(n, n, [recs]) for n in ("adams", "dgc99", "powersgd_r1")]
    _attach_times(results, [doc])
    link = doc["link"]["label"]
    assert link.startswith("loopback")
    assert [r.step_time_s.get(link) for r in results] == [2.0, 1.0, None]
