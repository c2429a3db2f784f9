"""What every run measures, in one form: its step records and its validation loss.

Both kinds of run go through :func:`~pipelines.training.loop.run_loop` and log the same
record, built by :func:`step_record`: ``step``, ``tokens``, ``loss`` (the mean over the
data-parallel ranks), ``lr``, ``grad_norm``, ``skipped``, ``bytes`` (what one rank sent this
step, every kind summed) and, on an evaluation step, ``val_loss`` from :func:`validation_loss`.
Each adds its own fields after those:

- the pretrain stage (``metrics.jsonl``): ``bytes_by_kind``, ``step_time``, ``tokens_per_s``;
- the quality studies: what the simulator measures beyond them (``mask_overlap``,
  ``moment_norm``), in :attr:`scape.megatron.train.StepResult.diagnostics`.

Records are read back through :func:`sent_by_kind` and :func:`sent_total`, which also read
the pretrain stage's records from before 2026-12-06 (``bytes`` by kind, no total), so the
committed peers' runs still report as they did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Record", "sent_by_kind", "sent_total", "step_record", "validation_loss"]

Record = dict[str, Any]


def step_record(step: int, tokens_per_step: int, loss: float, lr: float, result: Any,
                sent: dict[str, float]) -> Record:  # fmt: skip
    """The fields every step record has, in this order. ``step``: steps done (1-based);
    ``loss``: the rank mean; ``result``: the engine's
    :class:`~scape.megatron.train.StepResult`; ``sent``: one rank's bytes this step by kind."""
    return {
        "step": step,
        "tokens": step * tokens_per_step,
        "loss": loss,
        "lr": lr,
        "grad_norm": result.grad_norm,
        "skipped": not result.updated,
        "bytes": sum(sent.values()),
    }


def sent_by_kind(record: Record) -> dict[str, float]:
    """One rank's bytes of this step by kind of traffic; ``{"total": ...}`` for a record that
    logged the total only (a study's), ``{}`` for a record without bytes."""
    if "bytes_by_kind" in record:
        return dict(record["bytes_by_kind"])
    sent = record.get("bytes")
    if isinstance(sent, dict):  # the pretrain stage's records before 2026-12-06
        return dict(sent)
    return {} if sent is None else {"total": float(sent)}


def sent_total(record: Record) -> float:
    """One rank's bytes of this step, every kind summed (0 for a record without bytes)."""
    return float(sum(sent_by_kind(record).values()))


def validation_loss(model: nn.Module, batches: Any) -> float:
    """Token-weighted mean loss of ``model`` over ``batches`` (``(tokens, labels)`` pairs,
    each ``[b, s]``), in eval mode; the model is left in train mode.

    Each batch's mean is weighted by its token count in float64 on the host, so batches of
    unequal size count as their tokens do; with equal batches whose token count is a power of
    two this is bit for bit the plain mean of the batch means."""
    import torch  # here: the readers of records need no torch

    from scape.megatron.train import forward_loss

    device = next(model.parameters()).device
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for tokens, labels in batches:
            total += (
                float(forward_loss(model, tokens.to(device), labels.to(device))) * tokens.numel()
            )
            count += tokens.numel()
    model.train()
    return total / count
