"""Mask encodings: how one shard's k sorted indices travel as bytes.

All encodings here have a size that depends only on (S, k), which every rank knows, so
an all-gather of equal-sized byte payloads carries them and the receiver needs no header.

| encoding  | bytes                        | best when            |
| --------- | ---------------------------- | -------------------- |
| int32     | 4k                           | never below offset16 |
| offset16  | 2k + 4 * ceil(S / 65536)     | density < ~6%        |
| bitmap    | ceil(S / 8)                  | density > ~6%        |

Beyond these, a *delta* encoding (:func:`encode_mask_delta`) sends only what changed
since the previous mask of the same shard, which every rank already holds: the positions
(within the previous mask) of the d entries that leave and the d in-shard indices that
enter, each section in the cheapest fixed encoding for its (size, d), after a 4-byte d.
Its size depends on d, so ranks must agree on a length first (pad to the maximum).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "BLOCK",
    "FIXED_ENCODINGS",
    "decode_mask",
    "decode_mask_delta",
    "delta_nbytes",
    "encode_mask",
    "encode_mask_delta",
    "encoded_nbytes",
    "resolve_encoding",
]

BLOCK = 1 << 16  # offset16: indices are sent as 16-bit offsets inside 64Ki-entry blocks
FIXED_ENCODINGS = ("int32", "offset16", "bitmap")
_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def encoded_nbytes(shard_size: int, k: int, encoding: str) -> int:
    if encoding == "int32":
        return 4 * k
    if encoding == "offset16":
        return 2 * k + 4 * math.ceil(shard_size / BLOCK)
    if encoding == "bitmap":
        return math.ceil(shard_size / 8)
    if encoding == "auto":
        return encoded_nbytes(shard_size, k, resolve_encoding("auto", shard_size, k))
    raise ValueError(
        f"unknown mask encoding {encoding!r}; use one of auto, {', '.join(FIXED_ENCODINGS)}"
    )


def resolve_encoding(encoding: str, shard_size: int, k: int) -> str:
    """``auto`` -> the smallest fixed encoding for (S, k); ties go to the simpler one."""
    if encoding != "auto":
        encoded_nbytes(shard_size, k, encoding)  # validates the name
        return encoding
    return min(FIXED_ENCODINGS, key=lambda e: encoded_nbytes(shard_size, k, e))


def encode_mask(indices: Tensor, shard_size: int, encoding: str) -> Tensor:
    """Sorted int64 indices (k,) -> uint8 payload of ``encoded_nbytes(S, k, encoding)``."""
    encoding = resolve_encoding(encoding, shard_size, indices.numel())
    if encoding == "int32":
        return indices.to(torch.int32).view(torch.uint8)
    if encoding == "offset16":
        n_blocks = math.ceil(shard_size / BLOCK)
        counts = torch.bincount(indices // BLOCK, minlength=n_blocks).to(torch.int32)
        # uint16 has few kernels; int16 carries the same 16 bits.
        offsets = (indices % BLOCK).to(torch.int32).to(torch.int16)
        return torch.cat([counts.view(torch.uint8), offsets.view(torch.uint8)])
    bits = torch.zeros(math.ceil(shard_size / 8) * 8, dtype=torch.uint8, device=indices.device)
    bits[indices] = 1
    weights = _BIT_WEIGHTS.to(indices.device)
    return (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def _aligned(payload: Tensor) -> Tensor:
    """A contiguous byte tensor whose storage offset allows int32 views: a rank's chunk of an
    all-gathered buffer can start at any byte, and dtype views need aligned storage."""
    payload = payload.contiguous()
    return payload if payload.storage_offset() % 8 == 0 else payload.clone()


def decode_mask(payload: Tensor, shard_size: int, k: int, encoding: str) -> Tensor:
    """Inverse of :func:`encode_mask`: uint8 payload -> sorted int64 indices (k,)."""
    encoding = resolve_encoding(encoding, shard_size, k)
    expected = encoded_nbytes(shard_size, k, encoding)
    if payload.numel() != expected:
        raise ValueError(f"{encoding} payload has {payload.numel()} bytes, expected {expected}")
    if encoding == "int32":
        return _aligned(payload).view(torch.int32).to(torch.int64)
    if encoding == "offset16":
        n_blocks = math.ceil(shard_size / BLOCK)
        counts = _aligned(payload[: 4 * n_blocks]).view(torch.int32).to(torch.int64)
        offsets = _aligned(payload[4 * n_blocks :]).view(torch.int16).to(torch.int64) & 0xFFFF
        blocks = torch.repeat_interleave(torch.arange(n_blocks, device=payload.device), counts)
        return blocks * BLOCK + offsets
    weights = _BIT_WEIGHTS.to(payload.device)
    bits = (payload.view(-1, 1) & weights).ne(0).view(-1)[:shard_size]
    return torch.nonzero(bits).squeeze(1)


def delta_nbytes(shard_size: int, k: int, n_changed: int) -> int:
    """Bytes of :func:`encode_mask_delta` when ``n_changed`` of the k entries are replaced."""
    if not 0 <= n_changed <= k:
        raise ValueError(f"n_changed={n_changed} must be in [0, k={k}]")
    return (
        4
        + encoded_nbytes(k, n_changed, "auto")  # leaving: positions inside the previous mask
        + encoded_nbytes(shard_size, n_changed, "auto")  # entering: in-shard indices
    )


def encode_mask_delta(prev: Tensor, new: Tensor, shard_size: int) -> Tensor:
    """Sorted masks ``prev`` and ``new`` (both k entries) -> uint8 delta payload.

    Layout: int32 d | leave positions in ``prev`` (auto encoding over k) | entering indices
    (auto encoding over S). Both sections reuse :func:`encode_mask`, so each costs the
    smaller of int32, 16-bit offsets or a bitmap for its own (size, d).
    """
    if prev.numel() != new.numel():
        raise ValueError(f"masks differ in size: {prev.numel()} vs {new.numel()}")
    k = prev.numel()
    # Membership through a dense marker: O(S + k), much cheaper than isin's sort at large k.
    in_new = torch.zeros(shard_size, dtype=torch.bool, device=prev.device)
    in_new[new] = True
    in_prev = torch.zeros(shard_size, dtype=torch.bool, device=prev.device)
    in_prev[prev] = True
    leave_pos = torch.nonzero(~in_new[prev]).squeeze(1)
    enter = new[~in_prev[new]]
    header = torch.tensor([enter.numel()], dtype=torch.int32, device=prev.device)
    return torch.cat(
        [
            header.view(torch.uint8),
            encode_mask(leave_pos, k, "auto"),
            encode_mask(enter, shard_size, "auto"),
        ]
    )


def decode_mask_delta(payload: Tensor, prev: Tensor, shard_size: int) -> Tensor:
    """Inverse of :func:`encode_mask_delta` given the same ``prev``; returns the new mask.

    Bytes past :func:`delta_nbytes` (padding to a common length) are ignored.
    """
    k = prev.numel()
    d = int(payload[:4].clone().view(torch.int32)[0])
    n_leave = encoded_nbytes(k, d, "auto")
    n_enter = encoded_nbytes(shard_size, d, "auto")
    if payload.numel() < 4 + n_leave + n_enter:
        raise ValueError(
            f"delta payload has {payload.numel()} bytes, needs {4 + n_leave + n_enter} for d={d}"
        )
    # clone(): a section may start at an odd byte, and dtype views need aligned storage.
    leave_pos = decode_mask(payload[4 : 4 + n_leave].clone(), k, d, "auto")
    enter = decode_mask(payload[4 + n_leave : 4 + n_leave + n_enter].clone(), shard_size, d, "auto")
    keep = torch.ones(k, dtype=torch.bool, device=prev.device)
    keep[leave_pos] = False
    return torch.cat([prev[keep], enter]).sort().values
