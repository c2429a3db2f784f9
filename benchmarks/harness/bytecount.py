"""The byte count of ``make bench-bytes``: every method through Megatron's train step. SCAPE
reports its own ``ByteCounter``; Megatron's dense path has none, so :class:`CollectiveTap`
counts the collectives it calls: a measurement of the dense baseline, not a formula.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from scape.comm import GRAD_VALUES, PARAM_VALUES, SCALARS, ByteCounter, ring_bytes_per_rank
from scape.config import ScapeConfig

__all__ = ["CollectiveTap", "MegatronMethod", "bytecount_worker"]


class CollectiveTap:
    """Counts (ring bytes, per kind) the collectives Megatron issues, for the dense methods."""

    def __init__(self) -> None:
        import megatron.core.distributed.param_and_grad_buffer as pgb

        self.counter, world = ByteCounter(), dist.get_world_size()

        def tap(native: Callable, kind: str, ring: Callable[..., Tensor], passes: int = 1):
            def counted(*args: Any, **kw: Any):
                self.counter.add(kind, passes * ring_bytes_per_rank(ring(*args).nbytes, world))
                return native(*args, **kw)

            return counted

        # A ring sends a reduce-scatter's input, an all-gather's output; an all-reduce is both.
        # Megatron calls its module-level aliases for bucket collectives, torch's for the rest.
        pgb.dist_reduce_scatter_func = dist.reduce_scatter_tensor = tap(
            dist.reduce_scatter_tensor, GRAD_VALUES, lambda out, inp, *_: inp)  # fmt: skip
        pgb.dist_all_gather_func = dist.all_gather_into_tensor = tap(
            dist.all_gather_into_tensor, PARAM_VALUES, lambda out, inp, *_: out)  # fmt: skip
        dist.all_reduce = tap(dist.all_reduce, SCALARS, lambda t, *_: t, passes=2)


class MegatronMethod:
    """One contender through Megatron: ``optimizer`` adams or adamw (dense), or scape at
    ``sparsity`` with ``value_dtype`` on the wire; ``step`` is one train step and its bytes."""

    def __init__(self, shape, tap: CollectiveTap, bucket_size: int, *, name: str,
                 optimizer: str = "adams", sparsity: float = 0.99,
                 value_dtype: str = "float32") -> None:  # fmt: skip
        from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, wrap_ddp
        from scape.megatron.models import build_gpt_model

        self.name = name
        torch.manual_seed(0)  # every method (and rank) starts from the same weights
        config, model = build_gpt_model(shape)
        # Overlap on, so that ``bucket_size`` gives several buckets (Megatron uses one without).
        self.ddp = wrap_ddp(config, model, bucket_size=bucket_size, overlap_grad_reduce=True)
        if optimizer == "scape":
            from scape.megatron.optimizer import build_scape_optimizer

            cfg = ScapeConfig.for_sparsity(sparsity, value_dtype=value_dtype)
            self.optimizer = build_scape_optimizer(self.ddp, OptimizerSpec(kind="adams"), cfg,
                                                   check_every=0)  # fmt: skip
            self.counter = self.optimizer.scape.comm.counter
        else:
            self.optimizer = build_dense_optimizer(self.ddp, OptimizerSpec(kind=optimizer))
            self.counter = tap.counter

    def step(self, t: int, batch: Tensor) -> dict[str, Any]:
        """One train step: the method, step, loss and bytes it sent by kind (this rank)."""
        from scape.megatron.train import train_step

        before = self.counter.snapshot()
        result = train_step(self.ddp, self.optimizer, (batch[:, :-1], batch[:, 1:]))
        after = self.counter.snapshot()
        sent = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
        return {"method": self.name, "step": t, "loss": result.loss, "bytes": sent}


def bytecount_worker(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Every method of the spec stepped in turn on the same data: per step and method its
    bytes and loss; the model's size and its buckets' shard sizes."""
    from scape.megatron.dense import init_megatron
    from scape.megatron.layout import bucket_shards
    from scape.megatron.models import ModelShape

    m = {"vocab": 256, **spec["model"]}
    shape = ModelShape("bench-llama", "llama", m["layers"], m["hidden"], m["heads"], m["ffn"],
                       m["vocab"], m["seq"])  # fmt: skip
    init_megatron(1234)
    tap = CollectiveTap()
    methods = [
        MegatronMethod(shape, tap, spec["bucket_size"], **method) for method in spec["methods"]
    ]
    first, records = methods[0].ddp, []
    for i in range(spec["warmup"] + spec["rounds"]):
        # seeded byte tokens, (batch, seq + 1), per rank and step: counts do not depend on text
        g = torch.Generator().manual_seed((i * world + rank) * 7919)
        batch = torch.randint(0, m["vocab"], (m["batch"], m["seq"] + 1), generator=g)
        for method in methods:
            dist.barrier()
            records.append({**method.step(i + 1, batch), "measured": i >= spec["warmup"]})
    return {"n_params": sum(p.numel() for p in first.module.parameters()),
            "padded": first.buffers[0].grad_data.numel(),
            "shard_sizes": [s.size for s in bucket_shards(first)], "steps": records}  # fmt: skip
