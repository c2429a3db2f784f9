"""The emulated cluster: clean skips, shaper parameters, stale clean-up, and a 2-rank smoke
run through namespaces (on loopback when namespaces are not available)."""

import subprocess

from benchmarks import bytes as bench_bytes
from benchmarks.harness import netns
from benchmarks.harness.bytecount import bytecount_worker
from benchmarks.harness.launch import launch_ranks
from benchmarks.harness.netns import Cluster, LinkSpec, skip_reason

TINY = {"layers": 1, "hidden": 32, "heads": 2, "ffn": 64, "seq": 8, "batch": 1}


def test_skips_when_not_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "not root" in skip_reason()


def test_skips_without_iproute2(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    assert "`ip`" in skip_reason()


def test_tbf_parameters():
    link = LinkSpec(1000)
    # burst: rate / 100 Hz beats the 128 KiB floor at 1 Gbit/s, not at 10 Mbit/s
    assert link.tbf_args() == ["tbf", "rate", "1000mbit", "burst", "1250000", "latency", "20ms"]
    assert LinkSpec(10).tbf_args()[4] == str(128 * 1024)
    assert link.label == "1gbit" and LinkSpec(100).label == "100mbit"


def test_stale_names_are_recognized():
    assert netns._NAME_RE.match("scbench-123-abcdef-r0")
    assert netns._NAME_RE.match("scbench-123-abcdef-sw")
    assert not netns._NAME_RE.match("other-123-abcdef-r0")


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_two_rank_smoke(tmp_path):
    """Dense AdamS and SCAPE-99 through Megatron's train step, one rank per namespace (loopback
    without them): the namespaces are torn down and the counts match the formulas."""
    methods = [{"name": "dense-adams"},
               {"name": "scape-99", "optimizer": "scape", "sparsity": 0.99,
                "value_dtype": "float32"}]  # fmt: skip
    spec = {"model": TINY, "bucket_size": 8_000, "warmup": 2, "rounds": 1, "methods": methods}
    reason = skip_reason()
    if reason is None:
        with Cluster(2, LinkSpec(1000)) as c:
            names = [c.switch_ns, *c.rank_ns]
            results = launch_ranks(bytecount_worker, spec, tmp_path, world_size=2, cluster=c,
                                   timeout_s=300)  # fmt: skip
        # gloo binds to the namespace's eth0 (10.123.0.x): a run at all went over the veths
        assert not any(n in _netns_list() for n in names), "namespaces left behind"
    else:
        results = launch_ranks(bytecount_worker, spec, tmp_path, world_size=2, timeout_s=300)
    summary = bench_bytes.summarize_measured(results, methods)
    dense, scape = summary["methods"]["dense-adams"], summary["methods"]["scape-99"]
    # Dense ZeRO-1 at W=2, fp32 on CPU: each collective of padded * 4 bytes, half of it per rank.
    assert dense["bytes_per_rank"]["grad_values"] == summary["padded"] * 4 / 2
    assert dense["bytes_per_rank"]["param_values"] == summary["padded"] * 4 / 2
    assert len(summary["shard_sizes"]) > 1 and scape["matches_formula"], scape
    assert scape["dense_over_this"] > 20
