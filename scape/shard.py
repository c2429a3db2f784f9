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
4. ``decode``: every rank turns the summed buffer into the same dense q (W*S,).
5. every rank steps every entry with q (``rms_update_`` or ``sign_update_``) after
   decoupled weight decay, so replicas stay identical with no parameter all-gather.
6. ``owner_mask``: rank j's mask of shard j for the next step, from its committed m_j.

During the dense warm-up the candidate travels whole (identity basis) and m_r is emptied.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scape.basis import ShardBasis

__all__ = [
    "WIRE_DTYPES",
    "accumulate",
    "commit_moment_",
    "decode",
    "owner_mask",
    "pack",
    "rms_update_",
    "sign_update_",
]

WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def accumulate(moment: Tensor, grad: Tensor, beta: float) -> Tensor:
    """``beta * moment + grad`` as a new tensor (the moment itself is left as it was)."""
    return torch.add(grad, moment, alpha=beta)


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
    sent = wire.float().mul_(world_size).view(world_size, -1)
    removed = basis.synthesize(sent, masks).reshape(-1)
    torch.sub(candidate, removed, out=moment)


def decode(
    basis: ShardBasis | None, masks: Tensor | None, synced: Tensor, world_size: int
) -> Tensor:
    """The dense q (W*S,) of the summed buffer ``synced`` (W*n,), fp32, the same on every rank."""
    synced = synced.float()
    if basis is None:
        return synced
    return basis.synthesize(synced.view(world_size, -1), masks).reshape(-1)


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
    ``step`` counts the accepted updates, 1-based.
    """
    second_moment.mul_(beta).addcmul_(q, q, value=1.0 - beta)
    denom = torch.div(second_moment, 1.0 - beta**step).sqrt_().add_(eps)
    param.addcdiv_(q, denom, value=-lr)


def sign_update_(param: Tensor, q: Tensor, *, lr: float) -> None:
    """``p -= lr * sign(q)`` (DeMo's update)."""
    param.add_(q.sign(), alpha=-lr)


def owner_mask(basis: ShardBasis, moment_shard: Tensor) -> Tensor:
    """The owner's mask of its shard for the next step: top-k |coefficients| per chunk of its
    own first moment (C1: first-moment statistics; C2: made by the shard's owner)."""
    return basis.select(moment_shard)
