"""The byte count of ``make bench-bytes``: every method through Megatron's train step.

A small Llama on seeded byte tokens (no prepared corpus needed), each method in Megatron's DDP
with the distributed optimizer.
SCAPE reports its own ``ByteCounter``; Megatron's dense path has none, so
:class:`CollectiveTap` wraps the collectives it calls and counts ring bytes per kind: a
measurement of the dense baseline, not a formula. Nothing is timed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from scape.comm import GRAD_VALUES, PARAM_VALUES, SCALARS, ByteCounter, ring_bytes_per_rank
from scape.config import ScapeConfig

__all__ = ["CollectiveTap", "LlamaShape", "MegatronMethod", "MethodSpec", "bytecount_worker"]


@dataclass(frozen=True)
class LlamaShape:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    ffn: int = 704
    vocab: int = 256
    seq: int = 64
    batch: int = 1  # sequences per rank per step


def batch_for(shape: LlamaShape, *, rank: int, step: int, world_size: int) -> Tensor:
    """(batch, seq + 1) seeded byte tokens for this rank and step (counts do not depend on text)."""
    g = torch.Generator().manual_seed((step * world_size + rank) * 7919)
    return torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g)


@dataclass(frozen=True)
class MethodSpec:
    """One contender: ``optimizer`` adams or adamw (dense), or scape at ``sparsity`` with
    ``value_dtype`` on the wire (the library's default is float32)."""

    name: str
    optimizer: str = "adams"
    sparsity: float = 0.99
    value_dtype: str = "float32"


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


class MegatronMethod:
    """One contender through Megatron; ``step`` is one train step and the bytes it sent."""

    def __init__(self, spec: MethodSpec, shape: LlamaShape, tap: CollectiveTap, *,
                 bucket_size: int | None = None, seed: int = 0) -> None:  # fmt: skip
        from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, wrap_ddp
        from scape.megatron.models import ModelShape, build_gpt_model

        self.spec = spec
        torch.manual_seed(seed)  # every method (and rank) starts from the same weights
        config, model = build_gpt_model(ModelShape("bench-llama", "llama", shape.layers, shape.hidden,
                                                   shape.heads, shape.ffn, shape.vocab, shape.seq))  # fmt: skip
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

    def step(self, t: int, batch: Tensor) -> dict[str, Any]:
        """One train step: the method, step, loss and bytes it sent by kind (this rank)."""
        from scape.megatron.train import train_step

        before = self.counter.snapshot()
        result = train_step(self.ddp, self.optimizer, (batch[:, :-1], batch[:, 1:]))
        after = self.counter.snapshot()
        sent = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
        return {"method": self.spec.name, "step": t, "loss": result.loss, "bytes": sent}


def bytecount_worker(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Every method of the spec stepped in turn on the same data: per step and method the
    bytes it counted, the loss and (in a namespace) the bytes the interface sent; the
    model's size and its buckets' shard sizes."""
    from scape.megatron.dense import init_megatron

    shape = LlamaShape(**spec["model"])
    seed = spec.get("seed", 0)
    init_megatron(seed + 1234)
    tap = CollectiveTap()
    methods = [MegatronMethod(MethodSpec(**m), shape, tap, bucket_size=spec.get("bucket_size"),
                              seed=seed) for m in spec["methods"]]  # fmt: skip
    first = methods[0].ddp
    records = []
    for i in range(spec["warmup"] + spec["rounds"]):
        batch = batch_for(shape, rank=rank, step=i, world_size=world)
        for method in methods:
            dist.barrier()
            records.append({**method.step(i + 1, batch), "measured": i >= spec["warmup"]})
    return {"n_params": sum(p.numel() for p in first.module.parameters()),
            "padded": first.buffers[0].grad_data.numel(),
            "shard_sizes": methods[0].shard_sizes(), "steps": records}  # fmt: skip
