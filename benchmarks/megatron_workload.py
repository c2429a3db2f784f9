"""The Megatron train step as a benchmark ``Method`` (same seam as :mod:`benchmarks.workloads`).

Each method owns a Megatron-Core ``GPTModel`` (Llama family) wrapped in Megatron's DDP with
the distributed optimizer: dense AdamW/AdamS (``scape.megatron.dense``) or SCAPE
(``scape.megatron.optimizer``, when that module is present). Gradient and parameter
collectives run synchronously after backward (``overlap_grad_reduce`` off), as in the
communicator-level workload, so both workloads time the same schedule.

Bytes: SCAPE methods report their own ``ByteCounter``. Megatron's dense path has no
counter, so a :class:`CollectiveTap` wraps the collectives Megatron calls (its bucket
reduce-scatter/all-gather and ``torch.distributed.all_reduce``), counting ring bytes per
kind and the seconds spent in them. With ``ring=True`` the tap also swaps synchronous
reduce-scatters for :func:`benchmarks.ring.ring_reduce_scatter` (gloo's sends ~2x).
On CPU the model is fp32 and Megatron reduces grads in fp32, so dense values travel as fp32.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from benchmarks.compute import LlamaShape
from benchmarks.ring import ring_reduce_scatter
from benchmarks.workloads import PHASES, MethodSpec, StepRecord
from scape.comm import GRAD_VALUES, PARAM_VALUES, SCALARS, ByteCounter, ring_bytes_per_rank
from scape.config import ScapeConfig

__all__ = ["CollectiveTap", "MegatronMethod", "scape_adapter_available"]


def scape_adapter_available() -> bool:
    return importlib.util.find_spec("scape.megatron.optimizer") is not None


class CollectiveTap:
    """Counts (ring bytes) and times the collectives Megatron issues; optionally rings RS."""

    def __init__(self, *, ring: bool) -> None:
        import megatron.core.distributed.param_and_grad_buffer as pgb

        self.counter = ByteCounter()
        self.seconds = {GRAD_VALUES: 0.0, PARAM_VALUES: 0.0, SCALARS: 0.0}
        self.world = dist.get_world_size()
        native_rs, native_ag, native_ar = (
            dist.reduce_scatter_tensor, dist.all_gather_into_tensor, dist.all_reduce)  # fmt: skip

        def reduce_scatter(out: Tensor, inp: Tensor, *args: Any, async_op: bool = False, **kw: Any):
            self._count(GRAD_VALUES, inp)
            t0 = time.perf_counter()
            if ring and not async_op and not args and kw.get("op") in (None, dist.ReduceOp.SUM):
                ring_reduce_scatter(out, inp, kw.get("group"))
                work = None
            else:
                work = native_rs(out, inp, *args, async_op=async_op, **kw)
            self.seconds[GRAD_VALUES] += time.perf_counter() - t0
            return work

        def all_gather(out: Tensor, inp: Tensor, *args: Any, **kw: Any):
            self._count(PARAM_VALUES, out)
            return self._timed(PARAM_VALUES, native_ag, out, inp, *args, **kw)

        def all_reduce(tensor: Tensor, *args: Any, **kw: Any):
            self.counter.add(SCALARS, 2 * ring_bytes_per_rank(_nbytes(tensor), self.world))
            return self._timed(SCALARS, native_ar, tensor, *args, **kw)

        pgb.dist_reduce_scatter_func = reduce_scatter
        pgb.dist_all_gather_func = all_gather
        dist.reduce_scatter_tensor = reduce_scatter
        dist.all_gather_into_tensor = all_gather
        dist.all_reduce = all_reduce

    def _count(self, kind: str, t: Tensor) -> None:
        self.counter.add(kind, ring_bytes_per_rank(_nbytes(t), self.world))

    def _timed(self, kind: str, fn: Callable, *args: Any, **kw: Any):
        t0 = time.perf_counter()
        work = fn(*args, **kw)
        self.seconds[kind] += time.perf_counter() - t0
        return work


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def megatron_shape(shape: LlamaShape):
    from scape.megatron.models import ModelShape

    return ModelShape("bench-llama", "llama", shape.layers, shape.hidden, shape.heads, shape.ffn,
                      shape.vocab, shape.seq)  # fmt: skip


class MegatronMethod:
    """One contender through Megatron: ``step`` zeroes, runs forward/backward, syncs, steps."""

    def __init__(self, spec: MethodSpec, shape: LlamaShape, tap: CollectiveTap, seed: int = 0):
        from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, wrap_ddp
        from scape.megatron.models import build_gpt_model

        self.spec, self.tap = spec, tap
        torch.manual_seed(seed)  # every method (and rank) starts from the same weights
        config, model = build_gpt_model(megatron_shape(shape))
        self.ddp = wrap_ddp(config, model, overlap_grad_reduce=False)
        opt_spec = OptimizerSpec(kind=spec.optimizer if spec.density >= 1.0 else "adams")
        if spec.density >= 1.0:
            self.optimizer = build_dense_optimizer(self.ddp, opt_spec)
            self.counter = tap.counter
        else:
            from scape.megatron.optimizer import build_scape_optimizer

            cfg = ScapeConfig(density=spec.density, delay_mask=spec.overlap,
                              mask_encoding=spec.encoding, value_dtype=spec.wire,
                              selection=spec.selection)  # fmt: skip
            self.optimizer = build_scape_optimizer(self.ddp, opt_spec, cfg, check_every=0)
            self.counter = self.optimizer.scape.comm.counter

    def step(self, t: int, batch: Tensor) -> StepRecord:
        from scape.megatron.train import forward_loss

        before = self.counter.snapshot()
        tap_before = dict(self.tap.seconds)
        phases = dict.fromkeys(PHASES, 0.0)
        t0 = time.perf_counter()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss = forward_loss(self.ddp, batch[:, :-1], batch[:, 1:])
        loss.backward()
        t1 = time.perf_counter()
        self.ddp.finish_grad_sync()
        t2 = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        spent = {k: self.tap.seconds[k] - tap_before[k] for k in self.tap.seconds}
        phases["compute"] = t1 - t0
        phases["grad_sync"] = t2 - t1  # packing (SCAPE) and the reduce-scatter
        phases["param_sync"] = spent[PARAM_VALUES]  # mask and param all-gathers
        phases["update"] = t3 - t2 - spent[PARAM_VALUES]
        after = self.counter.snapshot()
        bytes_ = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
        return StepRecord(self.spec.name, t, float(loss.detach()), phases, bytes_)
