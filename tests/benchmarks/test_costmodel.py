"""The alpha-beta model against hand-computed values."""

import pytest

from benchmarks.costmodel import AlphaBeta, fit_alpha_beta, ring_time

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


def test_a_fit_round_trips_through_its_json_form():
    link = AlphaBeta(37e-6, 1.25e8)
    back = AlphaBeta.from_dict(link.to_dict())
    assert back.alpha_s == pytest.approx(link.alpha_s) and back.bandwidth_Bps == pytest.approx(
        link.bandwidth_Bps
    )
