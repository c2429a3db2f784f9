"""Projection arithmetic: collectives per bucket and per step, optimizer work, monotone in
batch size, calibration from a GPU check."""

import json

import pytest

from benchmarks.harness.paper import traffic_bytes
from benchmarks.projection import Assumptions, comm_seconds, optimizer_seconds, project_model

A = Assumptions()
N = 80_000_000  # two full 40M buckets at W=32: shards of 1.25M


def ring_time(nbytes: float, world: int, a: Assumptions) -> float:
    """One ring reduce-scatter (input) / all-gather (output): W-1 steps of T/W bytes each."""
    return (world - 1) * a.alpha_s + (world - 1) / world * nbytes / a.bandwidth_Bps


def test_dense_comm_is_two_rings_per_bucket():
    got = comm_seconds(N, None, A)
    per_bucket = ring_time(40_000_000 * 2, 32, A)
    assert got["grad_sync"] == pytest.approx(2 * per_bucket)
    assert got["param_sync"] == pytest.approx(2 * per_bucket)
    assert got["mask"] == 0.0


def test_scape_comm_is_one_all_reduce_per_bucket_and_one_mask_all_gather_per_step():
    got = comm_seconds(N, 0.99, A)
    values = (32 * 12_500 + 1) * 2  # W shards of 1 coefficient per 100 entries + the flag, bf16
    # an all-reduce is a reduce-scatter pass and an all-gather pass of the same buffer
    assert got["grad_sync"] == pytest.approx(2 * ring_time(values, 32, A))
    assert got["param_sync"] == pytest.approx(2 * ring_time(values, 32, A))
    assert got["mask"] == pytest.approx(ring_time(2 * 32 * 12_500, 32, A))  # 1 byte each
    fp32 = comm_seconds(N, 0.99, Assumptions(scape_value_bytes=4))
    assert fp32["grad_sync"] == pytest.approx(2 * ring_time(2 * values, 32, A))


def test_modeled_optimizer_work_updates_every_entry_on_every_rank():
    opt = optimizer_seconds(N, A)
    t = traffic_bytes(32, 1_250_000, 12_500)
    bw = A.hbm_Bps * A.hbm_efficiency
    assert opt["scape-99"] == pytest.approx(2 * sum(t["scape"].values()) / bw)
    assert opt["dense"] == pytest.approx(2 * sum(t["dense"].values()) / bw)
    assert opt["scape-99"] > 5 * opt["dense"]  # O(N) per rank against O(N / W) + the scaling
    assert "modeled" in opt["source"]


def test_speedup_falls_with_tokens_per_gpu():
    small = project_model("llama-1.8b", A, 1024)
    large = project_model("llama-1.8b", A, 65536)
    s, l_ = small["scape"]["scape-99"], large["scape"]["scape-99"]
    assert s["speedup_no_overlap"] > l_["speedup_no_overlap"]
    assert large["compute_s"] == pytest.approx(64 * small["compute_s"], rel=1e-9)
    assert s["optimizer_s"] == l_["optimizer_s"]  # optimizer work does not scale with tokens


def test_gpu_check_calibrates_mfu_and_kernels(tmp_path):
    from benchmarks.projection import _flops, gpu_calibration
    from scape.megatron.models import SHAPES

    assert gpu_calibration(tmp_path) is None  # no GPU run yet: the FLOP model stands
    shape = SHAPES["gpt-345m"]
    params = 354_871_296
    step = _flops(shape, 8 * 1024, params) / (989e12 * 0.5)  # a run at exactly 50% MFU
    row = {"select_s": 1.0, "pack_s": 0.1, "commit_s": 0.2, "decode_s": 0.3,
           "rms_update_all_entries_s": 0.4}  # fmt: skip
    report = {"status": "ok", "environment": {"gpu": "H200"},
              "megatron": [{"method": "dense", "shape": "gpt-345m", "params": params,
                            "median_step_s": step}],
              "kernels": {"buckets": 2, "dense_adams_update_s": 0.05, "sparsity_0.9": row,
                          "sparsity_0.99": dict(row, select_s=2.0)}}  # fmt: skip
    smoke = tmp_path / "gpu_check_cpu-smoke_20260101T000000Z.json"
    smoke.write_text(json.dumps({**report, "environment": {"gpu": None}}))
    assert gpu_calibration(tmp_path) is None  # the script's CPU smoke run calibrates nothing
    smoke.unlink()
    (tmp_path / "gpu_check_H200_20260101T000000Z.json").write_text(json.dumps(report))
    cal = gpu_calibration(tmp_path)
    assert cal["mfu"] == pytest.approx(0.5)
    assert cal["kernels"]["scape-90"] == pytest.approx(1.0 + 0.1 + 0.2 + 0.3 + 0.4)
    assert cal["kernels"]["scape-99"] == pytest.approx(2.0 + 0.1 + 0.2 + 0.3 + 0.4)
    opt = optimizer_seconds(N, A, cal)  # N has 2 buckets, as the calibration run
    # the kernels alone: weight decay rides in the update's pass (step_bucket_)
    assert opt["scape-99"] == pytest.approx(2.0 + 1.0)
    assert "GPU check kernels (H200)" in opt["source"]
