"""One data-parallel training step through Megatron's DDP and distributed optimizer.

The same helper drives the dense baselines and SCAPE (whose DDP/optimizer subclasses change
what happens inside ``finish_grad_sync`` and ``step``), the tests and the pretrain stage.
The forward gets an explicit causal mask and position ids: Megatron would otherwise build the
mask on ``"cuda"``, and being explicit keeps CPU and GPU runs on the same code path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["StepResult", "causal_mask", "position_ids", "sync_params", "train_step"]


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean token loss over this rank's micro-batches (before any all-reduce)
    grad_norm: float | None  # global norm of the synchronized gradient, if computed
    updated: bool  # False when the optimizer skipped the step (non-finite gradient)
    seconds: float  # wall time of the whole step on this rank
    # what an engine measures beyond these, logged after them (the simulator's mask overlap
    # and first-moment norm, when its method has them)
    diagnostics: dict[str, float] = field(default_factory=dict)


def causal_mask(seq_len: int, device: torch.device | str) -> Tensor:
    """``[1, 1, s, s]`` boolean mask, True where attention is *not* allowed (Megatron's sign)."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu_(1)[None, None]


def position_ids(batch: int, seq_len: int, device: torch.device | str) -> Tensor:
    return torch.arange(seq_len, device=device).unsqueeze(0).expand(batch, -1)


def _model_device(ddp) -> torch.device:
    return next(ddp.module.parameters()).device


def forward_loss(ddp, tokens: Tensor, labels: Tensor, loss_mask: Tensor | None = None) -> Tensor:
    """Mean (masked) next-token loss of one micro-batch ``[b, s]``."""
    b, s = tokens.shape
    device = tokens.device
    per_token = ddp(tokens, position_ids(b, s, device), causal_mask(s, device), labels=labels)
    per_token = per_token.float()
    if loss_mask is None:
        return per_token.mean()
    return (per_token * loss_mask).sum() / loss_mask.sum().clamp_min(1)


def train_step(
    ddp,
    optimizer,
    micro_batches: list[tuple[Tensor, Tensor]] | tuple[Tensor, Tensor],
) -> StepResult:
    """Zero grads, forward/backward every micro-batch, finish grad sync, optimizer step.

    ``micro_batches`` is one ``(tokens, labels)`` pair or a list of them (gradient
    accumulation: sync runs only after the last). Loss is averaged over micro-batches; Megatron's
    DDP then averages over ranks.
    """
    if isinstance(micro_batches, tuple):
        micro_batches = [micro_batches]
    start = time.perf_counter()
    device = _model_device(ddp)
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    total = 0.0
    n = len(micro_batches)
    for i, (tokens, labels) in enumerate(micro_batches):
        tokens, labels = tokens.to(device), labels.to(device)
        if i < n - 1:
            with ddp.no_sync():
                loss = forward_loss(ddp, tokens, labels) / n
                loss.backward()
        else:
            loss = forward_loss(ddp, tokens, labels) / n
            loss.backward()
        total += loss.item()
    ddp.finish_grad_sync()
    updated, grad_norm, _ = optimizer.step()
    if grad_norm is not None:
        grad_norm = float(grad_norm)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return StepResult(total, grad_norm, bool(updated), time.perf_counter() - start)


def sync_params(ddp) -> None:
    """Complete any pending parameter all-gather (``overlap_param_gather``) before reading params."""
    if ddp.ddp_config.overlap_param_gather:
        ddp.start_param_sync(force_sync=True)
