"""Projection arithmetic: collectives per bucket, mask sizes, monotone in batch size."""

import json

import pytest
from scape.encoding import delta_nbytes, encoded_nbytes

from benchmarks.costmodel import ring_time
from benchmarks.projection import Assumptions, comm_seconds, mask_bytes, project_model

A = Assumptions()


def test_dense_comm_is_two_rings_per_bucket():
    n = 80_000_000  # two full 40M buckets at W=32
    got = comm_seconds(n, 1.0, A)
    per_bucket = ring_time(40_000_000 * 2, 32, A.link)
    assert got["grad_sync"] == pytest.approx(2 * per_bucket)
    assert got["param_sync"] == pytest.approx(2 * per_bucket)
    assert got["mask"] == 0.0


def test_mask_bytes():
    assert mask_bytes(1_250_000, 12_500, "auto", None) == encoded_nbytes(
        1_250_000, 12_500, "offset16"
    )
    assert mask_bytes(1_250_000, 12_500, "delta", 0.9) == delta_nbytes(1_250_000, 12_500, 1250) + 4


OVERHEAD = {
    "buckets_per_model": {"llama-1.8b": 45},
    "devices": {"cpu": {lab: {"gpu_model": {"scape_s_per_step": 0.02, "dense_s_per_step": 0.01}}
                        for lab in ("scape-90", "scape-99")}},
}  # fmt: skip


def test_speedup_falls_with_tokens_per_gpu():
    small = project_model("llama-1.8b", {0.01: 0.9, 0.1: 0.9}, OVERHEAD, A, 1024)
    large = project_model("llama-1.8b", {0.01: 0.9, 0.1: 0.9}, OVERHEAD, A, 65536)
    s, l_ = small["scape"]["scape-99"], large["scape"]["scape-99"]
    assert s["speedup_no_overlap"] > l_["speedup_no_overlap"] > 1.0
    assert large["compute_s"] == pytest.approx(64 * small["compute_s"], rel=1e-9)
    assert s["optimizer_s"] == pytest.approx(0.02)


def test_gpu_check_calibrates_mfu_and_kernels(tmp_path):
    from benchmarks.projection import _flops, gpu_calibration
    from scape.megatron.models import SHAPES

    assert gpu_calibration(tmp_path) is None  # no GPU run yet: the FLOP model stands
    shape = SHAPES["gpt-345m"]
    params = 354_871_296
    step = _flops(shape, 8 * 1024, params) / (989e12 * 0.5)  # a run at exactly 50% MFU
    row = {"select_sampled_threshold_s": 1.0, "encode_offset16_s": 0.1, "encode_bitmap_s": 0.2,
           "decode_offset16_all_ranks_s": 0.3, "decode_bitmap_all_ranks_s": 0.4,
           "pack_s": 0.5, "scatter_params_s": 0.6}  # fmt: skip
    report = {"status": "ok", "environment": {"gpu": "H200"},
              "megatron": [{"method": "dense", "shape": "gpt-345m", "params": params,
                            "median_step_s": step}],
              "kernels": {"dense_adams_update_s": 0.05, "density_0.1": row, "density_0.01": row}}  # fmt: skip
    (tmp_path / "gpu_check_H200_20260101T000000Z.json").write_text(json.dumps(report))
    cal = gpu_calibration(tmp_path)
    assert cal["mfu"] == pytest.approx(0.5)
    assert cal["kernels"]["scape-99"] == pytest.approx(1.0 + 0.1 + 0.3 + 0.5 + 0.6)
    assert cal["kernels"]["scape-90"] == pytest.approx(1.0 + 0.2 + 0.4 + 0.5 + 0.6)
