"""Mask statistics and exact-k selection for one shard (pure functions, no process group).

A mask is a sorted int64 tensor of exactly ``k`` in-shard indices. Every shard of a bucket
has the same size S and so the same k, which keeps every rank's packed buffer the same
length and lets plain collectives carry it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "mask_generator",
    "mask_scores",
    "num_selected",
    "select_mask",
    "select_sampled_threshold",
    "select_topk",
]


def num_selected(shard_size: int, density: float) -> int:
    """k = ceil(density * S), at least 1 and at most S.

    The product is rounded to 6 decimals first: 0.01 * 300 is 3.0000000000000004 in binary
    floating point and must give 3, not 4.
    """
    if shard_size <= 0:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    return min(shard_size, max(1, math.ceil(round(density * shard_size, 6))))


def mask_generator(seed: int, step: int, shard_id: int) -> torch.Generator:
    """A CPU generator that depends only on (seed, step, shard), never on the rank.

    Whoever computes a shard's mask (its owner, or the simulator) draws the same numbers.
    """
    mixed = (seed * 1_000_003 + step) * 1_000_033 + shard_id
    return torch.Generator(device="cpu").manual_seed(mixed % (2**63 - 1))


def mask_scores(
    statistic: str,
    *,
    exp_avg: Tensor,
    local_accum: Tensor | None = None,
    age: Tensor | None = None,
    residual_weight: float = 1.0,
    age_weight: float = 0.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Score every entry of one shard; the mask is the k highest. Shape (S,) float32.

    exp_avg: the owner's first moment m for the shard.
    local_accum: the owner's own gradient buffer for the shard (its unsent residual, plus
        the fresh gradient when masks are not delayed); a sample of the global residual.
    age: steps since each entry was last sent (int tensor), for the starvation term.
    """
    if statistic == "momentum":
        scores = exp_avg.abs().float()
    elif statistic == "momentum_residual":
        _require(local_accum, "local_accum", statistic)
        scores = exp_avg.abs().float().add_(local_accum.abs().float(), alpha=residual_weight)
    elif statistic == "raw_gradient":
        _require(local_accum, "local_accum", statistic)
        scores = local_accum.abs().float()
    elif statistic == "random":
        scores = torch.rand(exp_avg.numel(), generator=generator).to(exp_avg.device)
    else:
        raise ValueError(f"unknown mask statistic {statistic!r}")
    if age_weight > 0.0:
        _require(age, "age", "age_weight > 0")
        # Normalize so the age term has the same meaning whatever the scale of m.
        scores = scores / scores.mean().clamp_min(torch.finfo(torch.float32).tiny)
        scores = scores.add_(age.float(), alpha=age_weight)
    return scores


def _require(tensor: Tensor | None, name: str, why: str) -> None:
    if tensor is None:
        raise ValueError(f"mask statistic {why!r} needs {name}")


def select_topk(scores: Tensor, k: int) -> Tensor:
    """Indices of the k largest scores, sorted ascending. Shape (k,) int64."""
    if not 1 <= k <= scores.numel():
        raise ValueError(f"k={k} must be in [1, {scores.numel()}]")
    if k == scores.numel():
        return torch.arange(k, device=scores.device)
    return torch.topk(scores, k, sorted=False).indices.sort().values


def select_sampled_threshold(
    scores: Tensor, k: int, *, sample_size: int, generator: torch.Generator
) -> Tensor:
    """Exactly k indices via a threshold estimated from a random sample of the scores.

    The threshold is set at a quantile with 25% head-room so that usually more than k
    entries pass; exact top-k then runs only over those candidates (a few times k instead
    of S). If too few pass, it falls back to exact top-k over the whole shard, so the
    result is always exactly the k largest, only found faster.
    """
    n = scores.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    if k == n or sample_size >= n:
        return select_topk(scores, k)
    sample_idx = torch.randint(n, (sample_size,), generator=generator).to(scores.device)
    q = max(0.0, 1.0 - 1.25 * k / n)
    threshold = torch.quantile(scores[sample_idx].float(), q)
    candidates = torch.nonzero(scores >= threshold).squeeze(1)
    if candidates.numel() < k:
        return select_topk(scores, k)
    top = torch.topk(scores[candidates], k, sorted=False).indices
    return candidates[top].sort().values


def select_mask(
    scores: Tensor,
    k: int,
    *,
    selection: str = "topk",
    sample_size: int = 16384,
    generator: torch.Generator | None = None,
) -> Tensor:
    if selection == "topk":
        return select_topk(scores, k)
    if selection == "sampled_threshold":
        if generator is None:
            raise ValueError("sampled_threshold selection needs a generator")
        return select_sampled_threshold(scores, k, sample_size=sample_size, generator=generator)
    raise ValueError(f"unknown selection {selection!r}")
