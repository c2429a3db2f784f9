"""Megatron's train step as a byte-count method: dense AdamW/AdamS or SCAPE, counters per step.

Each method owns a Megatron-Core ``GPTModel`` (Llama family) wrapped in Megatron's DDP with
the distributed optimizer: dense AdamW/AdamS (``scape.megatron.dense``) or SCAPE
(``scape.megatron.optimizer``), stepped by :func:`scape.megatron.train.train_step`, the
helper the pretrain stage uses.

Bytes: SCAPE methods report their own ``ByteCounter`` (what ``scape.comm`` books). Megatron's
dense path has no counter, so a :class:`CollectiveTap` wraps the collectives Megatron calls
(its bucket reduce-scatter/all-gather and ``torch.distributed.all_reduce``) and counts ring
bytes per kind: a measurement of the dense baseline, not a formula. On CPU the model is fp32
and Megatron reduces grads in fp32, so dense values travel as fp32.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from benchmarks.compute import LlamaShape
from scape.comm import GRAD_VALUES, PARAM_VALUES, SCALARS, ByteCounter, ring_bytes_per_rank
from scape.config import ScapeConfig

__all__ = ["CollectiveTap", "MegatronMethod", "MethodSpec", "StepRecord"]


@dataclass(frozen=True)
class MethodSpec:
    """One contender: ``optimizer`` adams or adamw (dense), or scape at ``sparsity`` with
    ``value_dtype`` on the wire (the library's default is float32)."""

    name: str
    optimizer: str = "adams"
    sparsity: float = 0.99
    value_dtype: str = "float32"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MethodSpec:
        return cls(**d)


@dataclass
class StepRecord:
    method: str
    step: int
    loss: float
    bytes: dict[str, float]  # this rank, this step, by kind (ring accounting)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CollectiveTap:
    """Counts (ring bytes, per kind) the collectives Megatron issues, for the dense methods."""

    def __init__(self) -> None:
        import megatron.core.distributed.param_and_grad_buffer as pgb

        self.counter = ByteCounter()
        self.world = dist.get_world_size()
        native_rs, native_ag, native_ar = (
            dist.reduce_scatter_tensor, dist.all_gather_into_tensor, dist.all_reduce)  # fmt: skip

        def reduce_scatter(out: Tensor, inp: Tensor, *args: Any, **kw: Any):
            self._count(GRAD_VALUES, inp)
            return native_rs(out, inp, *args, **kw)

        def all_gather(out: Tensor, inp: Tensor, *args: Any, **kw: Any):
            self._count(PARAM_VALUES, out)
            return native_ag(out, inp, *args, **kw)

        def all_reduce(tensor: Tensor, *args: Any, **kw: Any):
            self.counter.add(SCALARS, 2 * ring_bytes_per_rank(_nbytes(tensor), self.world))
            return native_ar(tensor, *args, **kw)

        # Megatron calls its module-level aliases for bucket collectives, torch's for the rest.
        pgb.dist_reduce_scatter_func = reduce_scatter
        pgb.dist_all_gather_func = all_gather
        dist.reduce_scatter_tensor = reduce_scatter
        dist.all_gather_into_tensor = all_gather
        dist.all_reduce = all_reduce

    def _count(self, kind: str, t: Tensor) -> None:
        self.counter.add(kind, ring_bytes_per_rank(_nbytes(t), self.world))


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def megatron_shape(shape: LlamaShape):
    from scape.megatron.models import ModelShape

    return ModelShape("bench-llama", "llama", shape.layers, shape.hidden, shape.heads, shape.ffn,
                      shape.vocab, shape.seq)  # fmt: skip


class MegatronMethod:
    """One contender through Megatron; ``step`` is one train step and the bytes it sent."""

    def __init__(self, spec: MethodSpec, shape: LlamaShape, tap: CollectiveTap, *,
                 bucket_size: int | None = None, seed: int = 0) -> None:  # fmt: skip
        from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, wrap_ddp
        from scape.megatron.models import build_gpt_model

        self.spec = spec
        torch.manual_seed(seed)  # every method (and rank) starts from the same weights
        config, model = build_gpt_model(megatron_shape(shape))
        # Overlap on, so that ``bucket_size`` gives several buckets (Megatron uses one without).
        self.ddp = wrap_ddp(config, model, bucket_size=bucket_size, overlap_grad_reduce=True)
        if spec.optimizer == "scape":
            from scape.megatron.optimizer import build_scape_optimizer

            cfg = ScapeConfig.for_sparsity(spec.sparsity, value_dtype=spec.value_dtype)
            self.optimizer = build_scape_optimizer(self.ddp, OptimizerSpec(kind="adams"), cfg,
                                                   check_every=0)  # fmt: skip
            self.counter = self.optimizer.scape.comm.counter
        else:
            self.optimizer = build_dense_optimizer(self.ddp, OptimizerSpec(kind=spec.optimizer))
            self.counter = tap.counter

    def shard_sizes(self) -> list[int]:
        """Entries per shard of each bucket (what SCAPE's byte formula needs)."""
        from scape.megatron.layout import bucket_shards

        return [s.size for s in bucket_shards(self.ddp)]

    def step(self, t: int, batch: Tensor) -> StepRecord:
        from scape.megatron.train import train_step

        before = self.counter.snapshot()
        result = train_step(self.ddp, self.optimizer, (batch[:, :-1], batch[:, 1:]))
        after = self.counter.snapshot()
        sent = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
        return StepRecord(self.spec.name, t, result.loss, sent)
