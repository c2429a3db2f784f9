"""The emulated cluster: clean skips, shaper parameters, stale clean-up, and a 2-rank smoke
run through namespaces (on loopback when namespaces are not available)."""

import json
import subprocess

from benchmarks import cluster, netns
from benchmarks.launch import launch_ranks
from benchmarks.netns import Cluster, LinkSpec, skip_reason

TINY = {"layers": 1, "hidden": 32, "heads": 2, "ffn": 64, "seq": 8, "batch": 1}


def test_skips_when_not_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "not root" in skip_reason()


def test_skips_without_iproute2(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    assert "`ip`" in skip_reason()


def test_cluster_bench_writes_skip_record(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(netns, "skip_reason", lambda: "not root: test")
    out = tmp_path / "cluster.json"
    assert cluster.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"skipped": "not root: test"}
    assert "SKIPPED: not root: test" in capsys.readouterr().out


def test_tbf_parameters():
    link = LinkSpec(1000)
    assert link.burst == 1_250_000  # rate / 100 Hz beats the 128 KiB floor at 1 Gbit/s
    assert LinkSpec(10).burst == 128 * 1024
    assert link.tbf_args() == ["tbf", "rate", "1000mbit", "burst", "1250000", "latency", "20ms"]
    assert link.label == "1gbit" and LinkSpec(100).label == "100mbit"


def test_stale_names_are_recognized():
    assert netns._NAME_RE.match("scbench-123-abcdef-r0")
    assert netns._NAME_RE.match("scbench-123-abcdef-sw")
    assert not netns._NAME_RE.match("other-123-abcdef-r0")


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_two_rank_smoke(tmp_path):
    """Dense and SCAPE (delta masks, no-delay) train side by side; bytes match the formulas."""
    spec = {"model": TINY, "warmup": 2, "rounds": 1, "calibrate": {"sizes": [4096, 1048576], "reps": 2},
            "methods": [{"name": "dense-adams"},
                        {"name": "scape-99-delta", "density": 0.01, "encoding": "delta"},
                        {"name": "scape-90-sync", "density": 0.1, "overlap": False}]}  # fmt: skip
    reason = skip_reason()
    if reason is None:
        with Cluster(2, LinkSpec(1000)) as c:
            names = [c.switch_ns, *c.rank_ns]
            results = launch_ranks("benchmarks.rank_main", spec, tmp_path, world_size=2,
                                   cluster=c, timeout_s=120)  # fmt: skip
        assert not any(n in _netns_list() for n in names), "namespaces left behind"
    else:
        results = launch_ranks("benchmarks.rank_main", spec, tmp_path, world_size=2, timeout_s=120)
    r0 = results[0]
    padded = r0["padded"]
    by_method = {row["method"]: row for row in r0["steps"] if row["measured"]}
    assert set(by_method) == {"dense-adams", "scape-99-delta", "scape-90-sync"}
    # Dense bf16 ZeRO-1 at W=2: each collective of padded*2 bytes costs half of it per rank.
    assert by_method["dense-adams"]["bytes"]["grad_values"] == padded * 2 / 2
    k = -(-r0["shard_size"] // 10)
    assert by_method["scape-90-sync"]["bytes"]["grad_values"] == 2 * k * 2 / 2
    assert by_method["scape-99-delta"]["mask_overlap"] is not None
    summary = cluster.summarize(results, 2)
    # Two tiny collectives on a busy machine may not separate latency from bandwidth.
    assert summary["fit_error"] or summary["methods"]["scape-90-sync"]["prediction_error_best"] < 10
    if reason is None:
        assert 0.9 < summary["wire_over_counted_bytes"] < 1.3
