"""The SCAPE step for one bucket, as pure functions over tensors (no process group).

The simulator calls these for every worker in one process; the Megatron adapter calls the
same functions for its own rank, with a real all-reduce in between. Anything that changes
numbers lives here, so oracle and product can only differ in transport.

One step, per rank r, for a bucket of W shards of S entries (shard j owned by rank j):

1. ``candidate = moment_beta * m_r + g_r``: the rank's first moment with this step's fresh
   gradient, every entry (W*S,). Not committed until the step is known to be finite.
2. ``pack``: in shard j, the coefficients of the candidate at shard j's mask (chosen by rank
   j at the end of the last step, and known to every rank since), divided by W, in the wire
   dtype: (W*n,), n = coefficients selected per shard. All ranks' packs are summed in ONE
   all-reduce: the one synchronized sparse buffer. No indices travel with the values.
3. ``commit_moment_``: the rank removes what it sent from its candidate, which becomes m_r.
4. every rank turns the summed buffer into the same dense q (W*S,) (``decode``), and
5. steps every entry with q (``rms_update_`` or ``sign_update_``) after decoupled weight
   decay, so replicas stay identical with no parameter all-gather. ``step_bucket_`` does 4
   and 5 block by block, q's block still in cache: the same bits, q never whole. q is
   clipped as Megatron clips a dense gradient (``clip_coefficient``), by its global norm
   over every bucket, read off the summed buffers (``buffer_sq_norm``): the bases are
   orthonormal, so no decode is needed and every rank gets the same scalar with no
   extra collective.
6. ``owner_mask``: rank j's mask of shard j for the next step, from its committed m_j.

During the dense warm-up the candidate travels whole (identity basis) and m_r is emptied.
"""

from __future__ import annotations

import bisect
from typing import TypeVar

import torch
from torch import Tensor

from scape.basis import ShardBasis

__all__ = [
    "WIRE_DTYPES",
    "accumulate",
    "all_finite",
    "buffer_sq_norm",
    "clip_coefficient",
    "commit_moment_",
    "decay_runs",
    "decode",
    "owner_mask",
    "pack",
    "rms_update_",
    "runs_within",
    "sign_update_",
    "step_bucket_",
    "weight_decay_",
]

WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Elementwise updates over a whole buffer run block by block: the temporaries stay small
# (cache-resident, reused by the allocator instead of fresh pages each step) and the
# result is the same bit for bit, since every operation is elementwise.
NormT = TypeVar("NormT", float, Tensor)
UPDATE_BLOCK = 1 << 18  # 1 MB of fp32: the fastest of 2^14-2^24 for the rms update on CPU


def accumulate(moment: Tensor, grad: Tensor, beta: float, out: Tensor | None = None) -> Tensor:
    """``beta * moment + grad``, a new tensor or ``out`` (the moment is left as it was)."""
    return torch.add(grad, moment, alpha=beta, out=out)


def all_finite(x: Tensor) -> Tensor:
    """Whether every entry of ``x`` is finite, as a 0-dim bool tensor, in one pass with no
    temporary: a sum is finite exactly when every entry is (an inf or NaN makes it inf or
    NaN), short of overflowing 3.4e38 fp32, which would take entries near 1e31 in a bucket of
    millions: a step worth skipping anyway."""
    return torch.isfinite(x.sum())


def buffer_sq_norm(synced: Tensor) -> float:
    """``||q||^2`` of the bucket's dense q, from its summed buffer (W*n,) alone.

    Every basis here (identity, chunked orthonormal DCT-II) preserves norms, and q is the
    synthesis of the buffer's coefficients, so the two norms agree up to rounding (Parseval).
    Summed per bucket in float64 by the caller. The dot runs on a fresh copy: CPU BLAS sums a
    view that starts off its allocator's alignment in another order, and the adapter's
    buffers are views of one payload buffer, the simulator's tensors of their own."""
    values = synced.to(torch.float32, copy=True)
    return float(torch.dot(values, values))


def clip_coefficient(total_norm: NormT, max_norm: float | None) -> NormT | None:
    """Megatron's rule for ``clip_grad``: scale by ``max_norm / (norm + 1e-6)`` when that is
    below 1; None when nothing is to be scaled (``max_norm`` None or <= 0 turns clipping
    off). The norm may be a float (SCAPE's, from the buffers) or a 0-dim tensor (the dense
    simulator's, in its dtype); the coefficient comes back in the same type."""
    if max_norm is None or max_norm <= 0:
        return None
    coeff = max_norm / (total_norm + 1.0e-6)
    return coeff if coeff < 1.0 else None


def pack(
    basis: ShardBasis | None,
    candidate: Tensor,
    masks: Tensor | None,
    *,
    world_size: int,
    value_dtype: str,
) -> Tensor:
    """This rank's contribution to the shared buffer: (W*n,) in the wire dtype.

    ``candidate`` (W*S,) is the bucket; ``masks`` (W, n) the shards' masks; ``basis`` None
    (dense warm-up) sends every entry as it is. Values are scaled by 1/W before the sum, as
    Megatron's DDP scales gradients, so the all-reduce yields a mean.
    """
    if basis is None:
        values = candidate.clone()
    else:
        values = basis.gather(candidate.view(world_size, -1), masks).reshape(-1)
    return values.mul_(1.0 / world_size).to(WIRE_DTYPES[value_dtype])


def commit_moment_(
    moment: Tensor,
    candidate: Tensor,
    basis: ShardBasis | None,
    masks: Tensor | None,
    wire: Tensor,
    *,
    world_size: int,
) -> None:
    """After an accepted step: ``m_r = candidate - what this rank sent``.

    What was sent is read back from the wire (times W), so a narrower wire's rounding error
    stays in the moment. In the dense warm-up everything was sent: the moment is emptied.
    """
    if basis is None:
        if wire.dtype == torch.float32:
            moment.zero_()
        else:
            torch.sub(candidate, wire.float() * world_size, out=moment)
        return
    sent = wire.float() * world_size  # a new tensor: the wire may be what was all-reduced
    # what was sent, synthesized block by block (no bucket-sized temporary), and
    # m = candidate - that written straight into the moment: (W, S)
    moments, candidates = moment.view(world_size, -1), candidate.view(world_size, -1)
    for w, (values, mask) in enumerate(zip(sent.view(world_size, -1), masks, strict=True)):
        for lo, hi, removed in basis.synthesis_blocks(values, mask):
            torch.sub(candidates[w, lo:hi], removed, out=moments[w, lo:hi])


def decode(
    basis: ShardBasis | None, masks: Tensor | None, synced: Tensor, world_size: int
) -> Tensor:
    """The dense q (W*S,) of the summed buffer ``synced`` (W*n,), fp32, the same on every
    rank. (The step itself never holds q whole: :func:`step_bucket_` decodes block by block;
    this is for inspection and tests.)"""
    synced = synced.float()
    if basis is None:
        return synced
    return basis.synthesize(synced.view(world_size, -1), masks).view(-1)


def rms_update_(
    param: Tensor,
    second_moment: Tensor,
    q: Tensor,
    *,
    step: int,
    lr: float,
    beta: float,
    eps: float,
) -> None:
    """``v <- b v + (1 - b) q^2``; ``p -= lr * q / (sqrt(v / (1 - b^step)) + eps)``.

    The second moment is rebuilt from the synchronized buffer alone (C4 of the abstract).
    ``step`` counts the accepted updates, 1-based. All three are flat (N,) tensors.
    """
    correction = 1.0 - beta**step
    for lo in range(0, q.numel(), UPDATE_BLOCK):
        hi = lo + UPDATE_BLOCK
        v, g = second_moment[lo:hi], q[lo:hi]
        v.mul_(beta).addcmul_(g, g, value=1.0 - beta)
        denom = torch.div(v, correction).sqrt_().add_(eps)
        param[lo:hi].addcdiv_(g, denom, value=-lr)


def decay_runs(mask: Tensor) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of True in a flat bool ``mask`` (the entries weight decay
    applies to: whole params, so a few hundred runs at most)."""
    edges = torch.diff(mask.to(torch.int8), prepend=mask.new_zeros(1, dtype=torch.int8),
                       append=mask.new_zeros(1, dtype=torch.int8))  # fmt: skip
    starts = (edges == 1).nonzero().flatten().tolist()
    ends = (edges == -1).nonzero().flatten().tolist()
    return list(zip(starts, ends, strict=True))


def runs_within(runs: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of sorted, disjoint ``runs`` inside ``[lo, hi)``, relative to ``lo`` (a
    bucket's decay runs out of the buffer's, a block's out of the bucket's)."""
    first = bisect.bisect_right([end for _, end in runs], lo)  # the first run ending after lo
    out = []
    for a, b in runs[first:]:
        if a >= hi:
            break
        out.append((max(a, lo) - lo, min(b, hi) - lo))
    return out


def weight_decay_(param: Tensor, runs: list[tuple[int, int]], factor: float) -> None:
    """Decoupled weight decay ``p *= factor`` on the runs of :func:`decay_runs`: the same
    bits as a masked multiply, without gathering and scattering every entry."""
    for start, end in runs:
        param[start:end].mul_(factor)


def sign_update_(param: Tensor, q: Tensor, *, lr: float) -> None:
    """``p -= lr * sign(q)`` (DeMo's update)."""
    param.add_(q.sign(), alpha=-lr)


def step_bucket_(
    param: Tensor,
    second_moment: Tensor | None,
    basis: ShardBasis | None,
    masks: Tensor | None,
    synced: Tensor,
    *,
    world_size: int,
    decay: list[tuple[int, int]],
    decay_factor: float,
    update: str,
    step: int,
    lr: float,
    beta: float,
    eps: float,
    clip: float | None = None,
) -> None:
    """Steps 4-5 for one bucket, fused block by block: decode the summed buffer ``synced``
    (W*n,) into q, scale it by ``clip`` (the step's :func:`clip_coefficient`; None leaves q
    untouched), then weight decay (``p *= decay_factor`` on the bucket-relative runs
    ``decay``) and the update (:func:`rms_update_` or :func:`sign_update_`) of ``param`` and
    ``second_moment`` (W*S,) while q's block is still in cache: q never exists whole.

    The same bits as decoding whole and stepping whole (every operation is elementwise)."""
    if basis is None:  # dense warm-up: q is the buffer itself
        q = synced.float()
        blocks = ((lo, min(lo + UPDATE_BLOCK, q.numel()), q[lo : lo + UPDATE_BLOCK])
                  for lo in range(0, q.numel(), UPDATE_BLOCK))  # fmt: skip
    else:
        per_shard = synced.view(world_size, -1)
        blocks = ((w * basis.size + lo, w * basis.size + hi, block)
                  for w in range(world_size)
                  for lo, hi, block in basis.synthesis_blocks(per_shard[w], masks[w]))  # fmt: skip
    for lo, hi, q_block in blocks:
        if clip is not None:
            q_block = q_block * clip  # a new tensor: in the warm-up q_block is the buffer
        p = param[lo:hi]
        if decay_factor != 1.0:
            weight_decay_(p, runs_within(decay, lo, hi), decay_factor)
        if update == "rms":
            rms_update_(p, second_moment[lo:hi], q_block, step=step, lr=lr, beta=beta, eps=eps)
        else:
            sign_update_(p, q_block, lr=lr)


def owner_mask(basis: ShardBasis, moment_shard: Tensor) -> Tensor:
    """The owner's mask of its shard for the next step: top-k |coefficients| per chunk of its
    own first moment (C1: first-moment statistics; C2: made by the shard's owner)."""
    return basis.select(moment_shard)
