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
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ShardBasis", "dct_matrix", "selected_count"]

MAX_CHUNK = 256  # one byte per chunk-relative offset on the wire
# Up to this k, gather projects each chunk on its k selected basis rows (one batched
# (1, C) @ (C, k) product per chunk); above it the whole chunked transform (one (C, C) GEMM)
# and a pick is faster. CPU time on one core, 2.5M entries, chunks of 100: k=1 3.8 ms and
# k=2 5.2 ms projected against ~10.5 ms transformed; k=10 111 ms against 9.8 ms (process
# time measured beside running studies: ratios, not a quiet-machine benchmark).
PROJECT_MAX_K = 4


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
        # synthesize's bag table: the C rows of the chunk's DCT, then the tail's L rows
        # zero-padded to C entries, so that one embedding bag covers the tail too. (C + L, C)
        self._bag_rows = self._d
        if self._d_tail is not None:
            padded = torch.nn.functional.pad(self._d_tail, (0, chunk - self.tail))
            self._bag_rows = torch.cat([self._d, padded])

    # ------------------------------------------------------------------ whole transform
    def transform(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Coefficients of ``x`` (..., S): full chunks (..., full, C) and the tail (..., L)."""
        head = x[..., : self.split].reshape(*x.shape[:-1], self.full, self.chunk) @ self._d.T
        tail = x[..., self.split :] @ self._d_tail.T if self._d_tail is not None else None
        return head, tail

    def select(self, moment: Tensor) -> Tensor:
        """The mask: in every chunk, the k coefficients of ``moment`` (S,) largest in
        magnitude, in ascending order of offset. (num_selected,) int64"""
        head, tail = self.transform(moment)
        if self.k == 1:  # one offset per chunk: nothing to sort
            parts = [head.abs().argmax(dim=-1)]
        else:
            parts = [
                head.abs().topk(self.k, dim=-1, sorted=False).indices.sort(-1).values.reshape(-1)
            ]
        if tail is not None:
            parts.append(tail.abs().topk(self.k_tail, sorted=False).indices.sort().values)
        return torch.cat(parts)

    # ------------------------------------------------------------------ at a mask
    # ``mask`` may carry leading batch dims matching ``x`` / ``values`` (one mask per shard).
    def _rows(self, mask: Tensor) -> tuple[Tensor, Tensor | None]:
        """The selected basis vectors: (..., full, k, C) and the tail's (..., k_tail, L)."""
        n_head = self.full * self.k
        head = self._d[mask[..., :n_head].reshape(*mask.shape[:-1], self.full, self.k)]
        tail = self._d_tail[mask[..., n_head:]] if self._d_tail is not None else None
        return head, tail

    def gather(self, x: Tensor, mask: Tensor) -> Tensor:
        """Coefficients of ``x`` (..., S) at ``mask``: (..., num_selected)."""
        if self.k > PROJECT_MAX_K:  # the whole transform (one GEMM), then pick
            head, tail = self.transform(x)
            head_idx, tail_idx = self._split(mask)
            parts = [head.gather(-1, head_idx).reshape(*x.shape[:-1], -1)]
            if tail is not None:
                parts.append(tail.gather(-1, tail_idx))
            return torch.cat(parts, dim=-1)
        head_rows, tail_rows = self._rows(mask)  # by projection on the selected rows only
        # one shard at a time: a shard's full chunks are a contiguous view (with a tail, the
        # batch's are not, and reshaping them together would copy every entry)
        batch = math.prod(x.shape[:-1])
        rows = head_rows.reshape(batch, self.full, self.k, self.chunk)  # (B, full, k, C)
        shards = x.reshape(batch, self.size)
        head = torch.stack(
            [
                torch.bmm(r, s[: self.split].view(self.full, self.chunk, 1))
                for r, s in zip(rows, shards, strict=True)
            ]
        )  # (B, full, k, 1)
        parts = [head.reshape(*x.shape[:-1], self.full * self.k)]
        if tail_rows is not None:
            parts.append((x[..., self.split :].unsqueeze(-2) * tail_rows).sum(-1))
        return torch.cat(parts, dim=-1)

    def synthesize(self, values: Tensor, mask: Tensor) -> Tensor:
        """The entries (..., S) whose coefficients are ``values`` (..., num_selected) at
        ``mask`` and zero elsewhere (the inverse transform of a sparse coefficient vector).

        Each chunk is the values-weighted sum of its selected basis rows: exactly an
        embedding bag over the DCT's rows, one fused pass that writes every entry once and
        materializes neither the rows nor dense coefficients. The tail is one more bag (its
        rows are the padded ones after the chunk's), so nothing is concatenated: with a tail
        the result is a strided view of (..., full + 1, C), without one it is contiguous."""
        batch, n_head = values.shape[:-1], self.full * self.k
        if self._d_tail is None:
            head = F.embedding_bag(
                mask.reshape(-1, self.k), self._bag_rows,
                per_sample_weights=values.reshape(-1, self.k).float(), mode="sum",
            )  # fmt: skip
            return head.view(*batch, self.split)
        bags = batch.numel()
        # per shard: full bags of k head offsets, then one bag of k_tail offsets (+ C)
        idx = torch.cat(
            [mask[..., :n_head], mask[..., n_head:] + self.chunk], dim=-1
        ).reshape(-1)  # fmt: skip
        per_shard = torch.arange(self.full + 1, device=mask.device) * self.k
        starts = torch.arange(bags, device=mask.device)[:, None] * self.num_selected + per_shard
        out = F.embedding_bag(
            idx, self._bag_rows, starts.reshape(-1),
            per_sample_weights=values.reshape(-1).float(), mode="sum",
        )  # fmt: skip
        # out: (bags * (full + 1), C); each shard's S entries lead its (full + 1) * C
        return out.view(*batch, (self.full + 1) * self.chunk)[..., : self.size]

    def _split(self, mask: Tensor) -> tuple[Tensor, Tensor]:
        """A mask's offsets as (..., full, k) for the full chunks and (..., k_tail)."""
        n_head = self.full * self.k
        head = mask[..., :n_head].reshape(*mask.shape[:-1], self.full, self.k)
        return head, mask[..., n_head:]
