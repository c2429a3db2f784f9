"""The alpha-beta model against hand-computed values."""

import pytest

from benchmarks.costmodel import AlphaBeta, fit_alpha_beta, predict_step, ring_time

LINK = AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e8)  # 100 us per step, 100 MB/s


def test_ring_time_by_hand():
    # W=4, 8 MB: 3 steps of 100 us + 3/4 * 8e6 / 1e8 = 0.0003 + 0.06
    assert ring_time(8e6, 4, LINK) == pytest.approx(0.0603)
    assert ring_time(8e6, 1, LINK) == 0.0
    assert ring_time(0, 4, LINK) == 0.0


def test_fit_recovers_alpha_and_bandwidth():
    points = [(w, n, ring_time(n, w, LINK)) for w in (2, 4) for n in (1e4, 1e6, 8e6)]
    fit = fit_alpha_beta(points)
    assert fit.alpha_s == pytest.approx(1e-4, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(1e8, rel=1e-6)


def test_fit_clips_negative_latency():
    # Times exactly proportional to bytes minus a bit: the intercept would be negative.
    points = [(4, n, 0.75 * n / 1e8 - 1e-5) for n in (1e6, 2e6, 4e6)]
    fit = fit_alpha_beta(points)
    assert fit.alpha_s == 0.0
    assert fit.bandwidth_Bps == pytest.approx(1e8, rel=0.01)


def test_fit_needs_two_points():
    with pytest.raises(ValueError):
        fit_alpha_beta([(4, 1e6, 0.01)])


def test_predict_step_by_hand():
    # Per-rank ring bytes 0.75 MB of grads at W=4 -> a 1 MB collective: 0.0003 + 0.0075 s.
    b = {"grad_values": 0.75e6, "param_values": 0.75e6, "masks": 0.375e6}
    on = predict_step(world_size=4, compute_s=0.1, local_s=0.02, bytes_per_rank=b,
                      reduce_scatter=LINK, all_gather=LINK)  # fmt: skip
    assert on.grad_sync == pytest.approx(0.0078)
    assert on.param_sync == pytest.approx(0.0078)
    assert on.mask_exposed == 0.0  # 0.5 MB mask all-gather hides behind 0.1 s of compute
    assert on.total == pytest.approx(0.1 + 0.02 + 2 * 0.0078)
    off = predict_step(world_size=4, compute_s=0.1, local_s=0.02, bytes_per_rank=b,
                       reduce_scatter=LINK, all_gather=LINK, mask_overlapped=False)  # fmt: skip
    assert off.mask_exposed == pytest.approx(0.0003 + 0.00375)
    delta = predict_step(world_size=4, compute_s=0.1, local_s=0.0, bytes_per_rank=b,
                         reduce_scatter=LINK, all_gather=LINK, mask_overlapped=False,
                         mask_collectives=2)  # fmt: skip
    assert delta.mask_exposed == pytest.approx(off.mask_exposed + 0.0003)


def test_predict_single_rank_is_compute_only():
    cost = predict_step(world_size=1, compute_s=0.1, local_s=0.01, bytes_per_rank={},
                        reduce_scatter=LINK, all_gather=LINK)  # fmt: skip
    assert cost.total == pytest.approx(0.11)
