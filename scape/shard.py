"""The SCAPE step for one bucket, as pure functions over tensors (no process group).

The simulator calls these for every worker and owner in one process; the Megatron adapter
calls the same functions for its own rank, with real collectives in between. Anything that
changes numbers lives here, so oracle and product can only differ in transport.

Buffers per rank (shapes for one bucket of W shards of S entries each; k per shard):
  residual (W*S,) fp32  gradient mass this rank has not sent yet (error feedback)
  grad     (W*S,)       this step's fresh local gradient
Per owner (its shard only):
  param (S,) fp32 main params, exp_avg (S,), age (S,) int32, mask (k,) int64 sorted.

The residual is kept apart from the fresh gradient and only committed once the step is
known to be finite, so a skipped step leaves residuals, m and masks untouched.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scape.adams import adams_update_
from scape.config import ScapeConfig
from scape.masks import mask_generator, mask_scores, num_selected, select_mask

__all__ = [
    "WIRE_DTYPES",
    "clip_coefficient",
    "commit_residual_",
    "next_mask",
    "owner_update_",
    "pack_values",
    "update_age_",
]

WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def pack_values(
    residual: Tensor, grad: Tensor, positions: Tensor, *, world_size: int, value_dtype: str
) -> Tensor:
    """Values this rank sends: (residual + grad)[positions] / W, in the wire dtype. (W*k,)

    Scaling by 1/W before the sum-reduce (as Megatron's DDP does) makes the reduce a mean;
    only the packed values are scaled, never the buffers, or the residual would shrink.
    """
    packed = residual[positions] + grad[positions]
    return packed.mul_(1.0 / world_size).to(WIRE_DTYPES[value_dtype])


def commit_residual_(
    residual: Tensor,
    grad: Tensor,
    positions: Tensor,
    wire: Tensor,
    *,
    world_size: int,
    error_feedback: bool,
) -> None:
    """After an accepted step: residual += grad, minus what was sent.

    With an fp32 wire the sent entries become exactly zero. With a narrower wire the
    rounding error of the cast stays behind, so no gradient mass is lost to it either.
    Without error feedback the unsent mass is dropped (the ablation).
    """
    if not error_feedback:
        return
    residual.add_(grad)
    if wire.dtype == torch.float32:
        residual[positions] = 0.0
    else:
        residual[positions] -= wire.float() * world_size


def clip_coefficient(total_norm: Tensor, max_norm: float | None) -> Tensor | None:
    """Megatron's rule: scale by max_norm / (norm + 1e-6) when that is below 1."""
    if max_norm is None or max_norm <= 0:
        return None
    coeff = max_norm / (total_norm + 1.0e-6)
    return coeff if coeff < 1.0 else None


def owner_update_(
    param: Tensor,
    exp_avg: Tensor,
    mask: Tensor,
    synced_grad: Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    off_mask_momentum: str = "freeze",
) -> Tensor:
    """Masked AdamS on one owner's shard; returns the k updated params to all-gather.

    Weight decay is not applied here: every rank applies it to all entries itself
    (:func:`scape.adams.apply_weight_decay_`) before this call.
    """
    sub_param = param[mask]
    sub_exp_avg = exp_avg[mask]
    if off_mask_momentum == "decay" and mask.numel() < exp_avg.numel():
        exp_avg.mul_(beta1)
    adams_update_(
        sub_param,
        sub_exp_avg,
        synced_grad.float(),
        step=step,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
    )
    param[mask] = sub_param
    exp_avg[mask] = sub_exp_avg
    return sub_param


def update_age_(age: Tensor, mask: Tensor) -> None:
    """Steps since each entry was last sent: +1 everywhere, 0 where just sent."""
    age.add_(1)
    age[mask] = 0


def next_mask(
    config: ScapeConfig,
    *,
    exp_avg: Tensor,
    local_accum: Tensor,
    age: Tensor,
    step: int,
    shard_id: int,
) -> Tensor:
    """The owner's mask for its shard, exactly k sorted indices.

    ``step`` is the step the mask will be used at; ``shard_id`` is unique per
    (bucket, shard), so random draws depend on neither rank nor process.
    """
    shard_size = exp_avg.numel()
    k = num_selected(shard_size, config.density)
    needs_generator = config.statistic == "random" or config.selection == "sampled_threshold"
    generator = mask_generator(config.seed, step, shard_id) if needs_generator else None
    scores = mask_scores(
        config.statistic,
        exp_avg=exp_avg,
        local_accum=local_accum,
        age=age,
        residual_weight=config.residual_weight,
        age_weight=config.age_weight,
        generator=generator,
    )
    return select_mask(
        scores,
        k,
        selection=config.selection,
        sample_size=config.threshold_sample_size,
        generator=generator,
    )
