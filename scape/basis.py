"""The chunked DCT in which SCAPE selects, sends and removes first-moment mass.

A shard of S entries is read as ``S // C`` chunks of C entries and, when C does not divide
S, one shorter tail chunk of ``S % C`` entries, each in its own orthonormal DCT-II basis.
A mask keeps k coefficients per chunk (``min(k, tail)`` in the tail): because the basis is
orthonormal, removing the sent coefficients from a moment removes exactly the mass that was
sent (conservation), and decoding a few coefficients per chunk moves every entry of the chunk.

Masks are chunk-relative offsets, one int64 tensor of ``num_selected`` entries per shard:
the first ``full * k`` are chunk-major ``(full, k)``, then the tail's. Offsets are below
C <= 256, so a mask travels as one byte per selected coefficient.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ShardBasis", "dct_matrix", "selected_count", "top_offsets"]

MAX_CHUNK = 256  # one byte per chunk-relative offset on the wire
# Up to this k, gather projects each chunk on its k selected basis rows (one (k, C) @ (C, 1)
# product per chunk); above it the whole chunked transform (one (C, C) GEMM per block) and a
# pick is faster: k=10 of 100 on 2 shards of 1.25M, one core, quiet machine, 8.0 ms
# transformed against 103 ms projected (a one-off timing, not a committed benchmark).
PROJECT_MAX_K = 4
# select, gather and synthesize walk a shard in blocks of this many chunks (400k entries at
# C=100): their temporaries stay cache-sized and are reused, where a fresh bucket-sized one
# per call costs its page faults every step on CPU (with this and a reused candidate buffer
# the 2-rank SCAPE-99 floor of bench-step went from 243 to 193 ms, quiet, side by side).
BLOCK_CHUNKS = 4096


def selected_count(size: int, chunk: int, k: int) -> int:
    """Coefficients a mask keeps in a shard of ``size`` entries: k in every full chunk of
    ``chunk``, ``min(k, tail)`` in the tail. What the byte accounting counts without building
    a basis."""
    full, tail = divmod(size, chunk)
    return full * k + min(k, tail)


@lru_cache(maxsize=32)
def _dct_cpu(size: int) -> Tensor:
    n = torch.arange(size, dtype=torch.float64)
    d = torch.cos(math.pi / size * (n[None, :] + 0.5) * n[:, None]) * math.sqrt(2.0 / size)
    d[0] /= math.sqrt(2.0)
    return d.float()


def dct_matrix(size: int, device: torch.device | str = "cpu") -> Tensor:
    """Orthonormal DCT-II, rows are basis vectors: ``coefs = x @ D.T``, ``x = coefs @ D``.

    Built in float64 and rounded once, so every rank and process holds the same bits. (C, C)
    """
    if size < 1:
        raise ValueError(f"DCT size must be >= 1, got {size}")
    return _dct_cpu(size).to(device)


# top_offsets compares magnitudes on all but the low OFFSET_BITS bits of their fp32 pattern,
# which carry the offset instead: one max (k=1) or one top-k of int32 keys (k>1) per row then
# gives value and offset together, faster on CPU than argmax / topk of fp32 values.
OFFSET_BITS = 8  # offsets < MAX_CHUNK = 2^8
# Up to this k, top_offsets takes k successive row maxima (each found key knocked out of
# its row), not one topk: the same set, since a row's keys are distinct. 5M coefficients in
# rows of 100, one core, ms per call (a one-off timing, not a committed benchmark):
# k=2 8 against 51, k=10 26 against 63, k=20 57 against 82, k=30 124 against 131.
ITERATED_MAX_K = 20


def top_offsets(coefs: Tensor, k: int) -> Tensor:
    """Per row of ``coefs`` (R, L), the offsets of the k largest magnitudes, ascending: (R, k)
    int64. ``coefs`` is overwritten (its magnitudes' bit patterns become the sort keys).

    A non-negative fp32 orders like its int32 bit pattern, so each key is the magnitude with
    its low 8 mantissa bits replaced by the offset: magnitudes are compared to 2^-15 relative
    (15 of 23 mantissa bits), and values closer than that are ranked by offset, the larger
    first. Keys in a row are distinct, so the k largest are one set, however ties fall."""
    rows, length = coefs.shape
    if rows == 0:
        return torch.empty(0, k, dtype=torch.int64, device=coefs.device)
    keys = coefs.abs_().view(torch.int32)
    offsets = torch.arange(length, dtype=torch.int32, device=coefs.device)
    keys.bitwise_and_(-(1 << OFFSET_BITS)).bitwise_or_(offsets)
    low_bits = (1 << OFFSET_BITS) - 1
    if k == 1:
        return keys.amax(-1, keepdim=True).bitwise_and_(low_bits).long()
    if k <= ITERATED_MAX_K:
        # k row maxima, each knocked out of its row before the next: (R,) per round
        top = torch.empty(rows, k, dtype=torch.int32, device=coefs.device)
        flat = keys.view(-1)
        row_starts = torch.arange(rows, device=coefs.device) * length
        for i in range(k):
            top[:, i] = keys.amax(-1)
            if i + 1 < k:
                flat.index_fill_(
                    0, row_starts + top[:, i].bitwise_and(low_bits), torch.iinfo(torch.int32).min
                )
    else:
        top = keys.topk(k, dim=-1, sorted=False).values  # the largest keys carry their offsets
    return top.bitwise_and_(low_bits).sort(dim=-1).values.long()


class ShardBasis:
    """Chunked DCT of one shard: transform, top-k selection, projection and synthesis."""

    def __init__(self, size: int, chunk: int, k: int, device: torch.device | str = "cpu") -> None:
        if not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"chunk={chunk} must be in [1, {MAX_CHUNK}] (one-byte offsets)")
        if not 1 <= k <= chunk:
            raise ValueError(f"k={k} must be in [1, chunk={chunk}]")
        if size < 1:
            raise ValueError(f"shard size must be >= 1, got {size}")
        self.size, self.chunk, self.k = size, chunk, k
        self.full, self.tail = divmod(size, chunk)
        self.k_tail = min(k, self.tail)
        self.num_selected = selected_count(size, chunk, k)
        self.split = self.full * chunk  # where the tail starts
        self._d = dct_matrix(chunk, device)
        self._d_tail = dct_matrix(self.tail, device) if self.tail else None
        self._scratch: dict[str, Tensor] = {}  # see _block_scratch

    def _block_scratch(self, use: str, rows: int, cols: int) -> Tensor:
        """A reused (rows, cols) fp32 output for one block's GEMM or row pick, one buffer per
        ``use`` (a synthesis block lives on while its caller runs other passes): a fresh
        megabyte-sized output per block costs its page faults on CPU (a block's GEMM at
        C=100: 31 ms against 67 ms per 10M entries)."""
        need = rows * cols
        buffer = self._scratch.get(use)
        if buffer is None or buffer.numel() < need:
            buffer = self._scratch[use] = torch.empty(need, device=self._d.device)
        return buffer[:need].view(rows, cols)

    def transform(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Coefficients of ``x`` (..., S): full chunks (..., full, C) and the tail (..., L)."""
        head = x[..., : self.split].reshape(*x.shape[:-1], self.full, self.chunk) @ self._d.T
        tail = x[..., self.split :] @ self._d_tail.T if self._d_tail is not None else None
        return head, tail

    def _blocks(self) -> range:
        """First chunks of the blocks of BLOCK_CHUNKS full chunks that the big passes walk."""
        return range(0, self.full, BLOCK_CHUNKS)

    def select(self, moment: Tensor) -> Tensor:
        """The mask: in every chunk, the k coefficients of ``moment`` (S,) largest in
        magnitude (compared as :func:`top_offsets` does), in ascending order of offset.
        (num_selected,) int64"""
        C, k = self.chunk, self.k
        mask = torch.empty(self.num_selected, dtype=torch.int64, device=moment.device)
        for lo in self._blocks():  # the transform block by block: cache-sized temporaries
            hi = min(lo + BLOCK_CHUNKS, self.full)
            coefs = torch.mm(
                moment[lo * C : hi * C].view(hi - lo, C),
                self._d.T,
                out=self._block_scratch("coefs", hi - lo, C),
            )  # (block, C)
            mask[lo * k : hi * k] = top_offsets(coefs, k).view(-1)
        if self._d_tail is not None:
            coefs = (moment[self.split :] @ self._d_tail.T).unsqueeze(0)  # (1, L)
            mask[self.full * k :] = top_offsets(coefs, self.k_tail).view(-1)
        return mask

    # ------------------------------------------------------------------ at a mask
    # ``mask`` may carry leading batch dims matching ``x`` / ``values`` (one mask per shard).
    def gather(self, x: Tensor, mask: Tensor) -> Tensor:
        """Coefficients of ``x`` (..., S) at ``mask``: (..., num_selected).

        Shard by shard, a block of chunks at a time, so no temporary is as large as the
        bucket. Up to PROJECT_MAX_K each chunk is projected on its k selected basis rows
        (one (k, C) @ (C, 1) product per chunk); above it the block is transformed whole
        (one GEMM) and the mask picks from it."""
        C, k, n_head = self.chunk, self.k, self.full * self.k
        shards = x.reshape(-1, self.size)
        masks = mask.reshape(-1, self.num_selected)
        out = torch.empty(masks.shape, dtype=x.dtype, device=x.device)
        for shard, m, o in zip(shards, masks, out, strict=True):
            for lo in self._blocks():
                hi = min(lo + BLOCK_CHUNKS, self.full)
                chunks = shard[lo * C : hi * C].view(hi - lo, C)
                offsets, dst = m[lo * k : hi * k], o[lo * k : hi * k]
                if k > PROJECT_MAX_K:
                    coefs = torch.mm(
                        chunks, self._d.T, out=self._block_scratch("coefs", hi - lo, C)
                    )
                    torch.gather(coefs, -1, offsets.view(hi - lo, k), out=dst.view(hi - lo, k))
                else:
                    rows = torch.index_select(self._d, 0, offsets,
                                              out=self._block_scratch("coefs", (hi - lo) * k, C))  # fmt: skip
                    rows = rows.view(hi - lo, k, C)
                    torch.bmm(rows, chunks.unsqueeze(-1), out=dst.view(hi - lo, k, 1))
            if self._d_tail is not None:
                o[n_head:] = (shard[self.split :] * self._d_tail[m[n_head:]]).sum(-1)
        return out.view(*x.shape[:-1], self.num_selected)

    def synthesize(self, values: Tensor, mask: Tensor, out: Tensor | None = None) -> Tensor:
        """The entries (..., S) whose coefficients are ``values`` (..., num_selected) at
        ``mask`` and zero elsewhere (the inverse transform of a sparse coefficient vector),
        fp32, written into ``out`` (..., S, contiguous) when given."""
        if out is None:
            out = torch.empty(*values.shape[:-1], self.size, device=values.device)
        values = values.reshape(-1, self.num_selected)
        shards = zip(values, mask.reshape(-1, self.num_selected), out.view(-1, self.size),
                     strict=True)  # fmt: skip
        for v, m, o in shards:
            for lo, hi, entries in self.synthesis_blocks(v, m):
                o[lo:hi].copy_(entries)
        return out

    def synthesis_blocks(self, values: Tensor, mask: Tensor) -> Iterator[tuple[int, int, Tensor]]:
        """One shard's synthesis (``values``, ``mask``: (num_selected,)) block by block:
        ``(lo, hi, entries)`` with ``entries`` the fp32 values of entries ``[lo, hi)``, a
        cache-sized temporary that a caller can use before the next block overwrites the
        cache (the fused update of :func:`scape.shard.step_bucket_` does).

        Each chunk is the values-weighted sum of its selected basis rows: exactly an
        embedding bag over the DCT's rows, which materializes neither the rows nor dense
        coefficients. At k = 1 a bag is one scaled row: the same bits from a row pick into a
        reused block and one multiply, 9x faster on CPU (2.8 ms against 25 ms per 10M
        entries). The tail is one more bag, over the tail's rows."""
        C, k, n_head = self.chunk, self.k, self.full * self.k
        values = values.float()
        for lo in self._blocks():
            hi = min(lo + BLOCK_CHUNKS, self.full)
            offsets, weights = mask[lo * k : hi * k], values[lo * k : hi * k]
            if k == 1:
                rows = self._block_scratch("synthesis", hi - lo, C)
                bags = torch.index_select(self._d, 0, offsets, out=rows).mul_(weights[:, None])
            else:
                bags = F.embedding_bag(offsets.view(hi - lo, k), self._d,
                                       per_sample_weights=weights.view(hi - lo, k), mode="sum")  # fmt: skip
            yield lo * C, hi * C, bags.view(-1)
        if self._d_tail is not None:
            tail = F.embedding_bag(mask[n_head:].view(1, -1), self._d_tail,
                                   per_sample_weights=values[n_head:].view(1, -1), mode="sum")  # fmt: skip
            yield self.split, self.size, tail.view(-1)
