"""Mask encodings round-trip and cost what the table in scape/encoding.py says."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scape.encoding import BLOCK, decode_mask, encode_mask, encoded_nbytes, resolve_encoding


@st.composite
def masks(draw):
    n = draw(st.integers(1, 3 * BLOCK + 17))
    k = draw(st.integers(1, min(n, 2000)))
    seed = draw(st.integers(0, 2**31))
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].sort().values
    return n, idx


@settings(max_examples=80, deadline=None)
@given(mask=masks(), encoding=st.sampled_from(["int32", "offset16", "bitmap", "auto"]))
def test_round_trip(mask, encoding):
    n, idx = mask
    payload = encode_mask(idx, n, encoding)
    assert payload.dtype == torch.uint8
    assert payload.numel() == encoded_nbytes(n, idx.numel(), encoding)
    assert torch.equal(decode_mask(payload, n, idx.numel(), encoding), idx)


def test_sizes_match_formulas():
    s, k = 1_000_000, 10_000
    assert encoded_nbytes(s, k, "int32") == 4 * k
    assert encoded_nbytes(s, k, "offset16") == 2 * k + 4 * math.ceil(s / BLOCK)
    assert encoded_nbytes(s, k, "bitmap") == s // 8


def test_auto_picks_the_smallest():
    s = 1_000_000
    assert resolve_encoding("auto", s, s // 100) == "offset16"  # 1% density
    assert resolve_encoding("auto", s, s // 10) == "bitmap"  # 10% density


def test_edge_indices_survive():
    n = 2 * BLOCK + 1
    idx = torch.tensor([0, BLOCK - 1, BLOCK, 2 * BLOCK])
    for enc in ("int32", "offset16", "bitmap"):
        assert torch.equal(decode_mask(encode_mask(idx, n, enc), n, 4, enc), idx)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown mask encoding 'zip'"):
        encoded_nbytes(10, 2, "zip")
    with pytest.raises(ValueError, match="expected"):
        decode_mask(torch.zeros(3, dtype=torch.uint8), 100, 2, "int32")


def test_decode_accepts_a_chunk_at_an_odd_byte_offset():
    """A rank's slice of an all-gathered buffer can start anywhere."""
    n, idx = 5000, torch.tensor([1, 7, 4000])
    for enc in ("int32", "offset16", "bitmap"):
        payload = encode_mask(idx, n, enc)
        gathered = torch.cat([torch.zeros(3, dtype=torch.uint8), payload])
        assert torch.equal(decode_mask(gathered[3:], n, 3, enc), idx)
