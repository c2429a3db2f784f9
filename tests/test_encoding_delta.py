"""The mask-delta encoding round-trips and costs what ``delta_nbytes`` says."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scape.encoding import (
    BLOCK,
    decode_mask_delta,
    delta_nbytes,
    encode_mask_delta,
    encoded_nbytes,
)


@st.composite
def mask_pairs(draw):
    """Two sorted k-subsets of [0, n) that share a drawn number of entries."""
    n = draw(st.integers(1, 2 * BLOCK + 33))
    k = draw(st.integers(1, min(n, 3000)))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    prev = torch.randperm(n, generator=g)[:k]
    outside = torch.ones(n, dtype=torch.bool)
    outside[prev] = False
    pool = torch.nonzero(outside).squeeze(1)
    d = draw(st.integers(0, min(k, pool.numel())))
    enter = pool[torch.randperm(pool.numel(), generator=g)[:d]]
    keep = prev[torch.randperm(k, generator=g)[: k - d]]
    return n, prev.sort().values, torch.cat([keep, enter]).sort().values, d


@settings(max_examples=80, deadline=None)
@given(pair=mask_pairs())
def test_round_trip_and_size(pair):
    n, prev, new, d = pair
    payload = encode_mask_delta(prev, new, n)
    assert payload.dtype == torch.uint8
    assert payload.numel() == delta_nbytes(n, prev.numel(), d)
    assert torch.equal(decode_mask_delta(payload, prev, n), new)


def test_padding_is_ignored():
    prev = torch.tensor([1, 5, 9, 70000])
    new = torch.tensor([1, 6, 9, 80000])
    payload = encode_mask_delta(prev, new, 100_000)
    padded = torch.cat([payload, torch.full((13,), 255, dtype=torch.uint8)])
    assert torch.equal(decode_mask_delta(padded, prev, 100_000), new)
    # A payload cut out of an all-gather output starts at any byte offset.
    gathered = torch.cat([torch.zeros(3, dtype=torch.uint8), padded])
    assert torch.equal(decode_mask_delta(gathered[3:], prev, 100_000), new)


def test_unchanged_mask_costs_only_the_header():
    mask = torch.arange(0, 1000, 10)
    assert encode_mask_delta(mask, mask, 1000).numel() == 4 == delta_nbytes(1000, 100, 0)


def test_size_by_hand():
    # S = 1M, k = 10k (1%), d = 500 changed entries:
    # leave: 500 positions in [0, 10k) -> offset16: 2*500 + 4*1 = 1004 (bitmap 1250, int32 2000)
    # enter: 500 indices in [0, 1M)   -> offset16: 2*500 + 4*16 = 1064
    assert delta_nbytes(1 << 20, 10_000, 500) == 4 + 1004 + 1064
    # With high churn the bitmap over the previous mask wins for the leaving side.
    assert delta_nbytes(1 << 20, 10_000, 5000) == 4 + 1250 + encoded_nbytes(1 << 20, 5000, "auto")


def test_rejects_bad_inputs():
    with pytest.raises(ValueError):
        encode_mask_delta(torch.arange(3), torch.arange(4), 10)
    with pytest.raises(ValueError):
        delta_nbytes(10, 3, 4)
    payload = encode_mask_delta(torch.tensor([0, 1]), torch.tensor([2, 3]), 10)
    with pytest.raises(ValueError):
        decode_mask_delta(payload[:-1], torch.tensor([0, 1]), 10)
