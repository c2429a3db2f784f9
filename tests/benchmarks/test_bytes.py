"""bench-bytes' paper-scale table: Megatron's bucket rule and the shared SCAPE formula."""

import pytest

from benchmarks.bytes import MEASURED_METHODS, paper_scale_bytes, scape_formula
from benchmarks.harness.paper import megatron_buckets
from scape.comm import step_bytes_per_rank


def test_buckets_follow_megatron_rule():
    sizes = megatron_buckets(100_000_000, 32)
    assert sizes[:2] == [40_000_000, 40_000_000]
    assert all(s % 128 == 0 for s in sizes)  # padded to lcm(W=32, 128) = 128
    assert sum(sizes) >= 100_000_000


def test_paper_scale_follows_the_shared_formula():
    n, w = 320_000_000, 32  # 8 buckets of 40M, shards of 1.25M
    out = paper_scale_bytes(n, w)["methods"]
    ring = (w - 1) / w
    dense = out["dense-adams"]
    assert dense["total"] == pytest.approx(ring * 4 * n)  # bf16 RS 2N + AG 2N
    s99 = out["scape-99-bf16"]["bytes_per_rank"]
    shared = step_bytes_per_rank([12_500] * 8, w, 2, masks=True)
    assert s99 == {k: shared[k] for k in ("grad_values", "param_values", "masks")}
    assert s99["grad_values"] == pytest.approx(ring * 8 * (32 * 12_500 + 1) * 2)
    assert s99["masks"] == pytest.approx(ring * 0.01 * n)  # one byte per coefficient
    # values 2 x 2 bytes x N/100 and masks N/100: 5% of the values' 2 bytes -> about 1/80
    assert out["scape-99-bf16"]["dense_over_this"] == pytest.approx(80, rel=0.01)
    assert out["scape-99"]["dense_over_this"] == pytest.approx(4 / 0.09, rel=0.01)  # fp32
    assert out["scape-90-bf16"]["dense_over_this"] == pytest.approx(8, rel=0.01)


def test_the_shipped_scape99s_run_mean_counts_its_dense_step_and_its_ramp():
    from benchmarks.bytes import RUN_STEPS, shipped_run_config
    from benchmarks.harness.paper import dense_bytes, scape_run_bytes
    from scape.config import ScapeConfig

    n, w = 320_000_000, 32
    out = paper_scale_bytes(n, w)["methods"]
    cfg, nbytes = shipped_run_config()
    assert (cfg.ramp_start_k, cfg.k, nbytes) == (10, 1, 2)  # the shipped ramp, bf16 values
    assert cfg.ramp_steps == round(0.15 * RUN_STEPS)
    run, steady = out["scape-99-shipped-run"]["total"], out["scape-99-bf16"]["total"]
    assert 1.3 < run / steady < 1.6  # the study's x1.41, plus the dense step
    # without a ramp the mean is the steady step's but for the one dense step
    flat = scape_run_bytes(n, w, ScapeConfig(), 100, 2)
    dense = sum(dense_bytes(n, w).values())
    assert sum(flat.values()) == pytest.approx((dense + 99 * steady) / 100)


def test_measured_scape_rows_are_checked_against_the_formula():
    (s99,) = [m for m in MEASURED_METHODS if m["name"] == "scape-99"]
    got = scape_formula(s99, [1050, 300], 4)  # 10 + 1 and 3 coefficients per shard
    want = step_bytes_per_rank([11, 3], 4, 4, masks=True)
    assert got == {k: v for k, v in want.items() if v}
