"""bench-core's byte figures follow the reference doc's accounting; its overhead part runs."""

import pytest

from benchmarks.core import bytes_per_step, main, megatron_buckets

# The machine may be shared (studies, other tests): these check function, not speed.
QUIET_OFF = ["--allow-busy", "--retries", "0", "--settle-s", "0"]


def test_buckets_follow_megatron_rule():
    sizes = megatron_buckets(100_000_000, 32)
    assert sizes[:2] == [40_000_000, 40_000_000]
    assert all(s % 128 == 0 for s in sizes)  # padded to lcm(W=32, 128) = 128
    assert sum(sizes) >= 100_000_000


def test_bytes_match_reference_table_for_large_world():
    n, w = 320_000_000, 32
    out = bytes_per_step(n, w)["per_rank_bytes"]
    ring = (w - 1) / w
    assert out["dense_zero1_bf16"]["total"] == pytest.approx(ring * 4 * n)  # RS 2N + AG 2N
    s99 = out["scape99/int32"]
    assert s99["grad_values"] + s99["param_values"] == pytest.approx(
        ring * 0.04 * n
    )  # 2*rho*N each
    assert s99["total"] == pytest.approx(ring * 0.08 * n)  # + rho*N int32 indices
    assert out["scape99/bitmap"]["masks"] == pytest.approx(ring * n / 8)


def test_main_prints_overhead_with_medians(capsys):
    report = main(["--params", "2e6", "--world-size", "4", "--repeats", "1", *QUIET_OFF])
    assert report["world_size"] == 4 and "scape99" in report["overhead_per_shard"]
    assert '"per_rank_bytes"' in capsys.readouterr().out
