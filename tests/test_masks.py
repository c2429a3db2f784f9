"""Mask statistics and exact-k selection."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scape.masks import (
    mask_generator,
    mask_scores,
    num_selected,
    select_mask,
    select_sampled_threshold,
    select_topk,
)


@pytest.mark.parametrize(
    "shard_size, density, k",
    [
        (300, 0.01, 3),
        (100, 0.1, 10),
        (101, 0.1, 11),
        (7, 0.01, 1),
        (5, 1.0, 5),
        (1000, 0.999, 999),
        (3, 0.5, 2),
    ],
)
def test_k_is_ceil_of_density_times_size(shard_size, density, k):
    assert num_selected(shard_size, density) == k


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_density_out_of_range_is_rejected(bad):
    with pytest.raises(ValueError, match="density"):
        num_selected(10, bad)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), density=st.floats(0.001, 1.0), seed=st.integers(0, 2**31))
def test_topk_returns_exactly_k_sorted_largest(n, density, seed):
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    k = num_selected(n, density)
    idx = select_topk(scores, k)
    assert idx.numel() == k and torch.all(idx[1:] > idx[:-1])
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[idx] = True
    if k < n:
        assert scores[chosen].min() >= scores[~chosen].max()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(50, 20000), density=st.sampled_from([0.01, 0.1, 0.3]), seed=st.integers(0, 2**31)
)
def test_sampled_threshold_selects_the_same_values_as_exact_topk(n, density, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen).abs()
    k = num_selected(n, density)
    fast = select_sampled_threshold(scores, k, sample_size=256, generator=mask_generator(1, 2, 3))
    exact = select_topk(scores, k)
    assert fast.numel() == k and torch.all(fast[1:] > fast[:-1])
    assert torch.equal(scores[fast].sort().values, scores[exact].sort().values)


def test_statistics():
    m = torch.tensor([0.5, -2.0, 0.1, 0.0])
    r = torch.tensor([0.0, 0.0, 3.0, -1.0])
    assert torch.equal(mask_scores("momentum", exp_avg=m), m.abs())
    assert torch.equal(
        mask_scores("momentum_residual", exp_avg=m, local_accum=r, residual_weight=0.5),
        m.abs() + 0.5 * r.abs(),
    )
    assert torch.equal(mask_scores("raw_gradient", exp_avg=m, local_accum=r), r.abs())
    a = mask_scores("random", exp_avg=m, generator=mask_generator(0, 5, 1))
    b = mask_scores("random", exp_avg=m, generator=mask_generator(0, 5, 1))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="local_accum"):
        mask_scores("raw_gradient", exp_avg=m)
    with pytest.raises(ValueError, match="unknown mask statistic"):
        mask_scores("gradient", exp_avg=m)


def test_age_term_eventually_selects_a_starved_entry():
    m = torch.tensor([1.0, 1.0, 1.0, 1e-6])
    age = torch.tensor([0, 0, 0, 0], dtype=torch.int32)
    picked_last = False
    for _ in range(20):
        idx = select_mask(mask_scores("momentum", exp_avg=m, age=age, age_weight=0.5), 1)
        age += 1
        age[idx] = 0
        picked_last |= bool((idx == 3).any())
    assert picked_last


def test_generator_depends_on_step_and_shard_not_on_call_site():
    draw = lambda s, j: torch.rand(4, generator=mask_generator(7, s, j))  # noqa: E731
    assert torch.equal(draw(3, 1), draw(3, 1))
    assert not torch.equal(draw(3, 1), draw(4, 1))
    assert not torch.equal(draw(3, 1), draw(3, 2))
