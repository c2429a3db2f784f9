"""PyTorch's PowerSGD DDP comm hook (Vogels et al., NeurIPS 2019), with its bytes counted.

The compression is torch's own ``powerSGD_hook``, called unchanged; this module only counts
what it sends and makes its state checkpointable. Bytes, per rank, ring accounting:

* before ``start_iter``: the hook all-reduces the whole bucket, 2 (W-1)/W * bucket bytes;
* after: it all-reduces the uncompressed tensors, then P, then Q, whose total element count
  it adds to ``state.total_numel_after_compression`` synchronously, before returning its
  future (torch 2.13, ``powerSGD_hook``: sum of (n + m) * r per compressed n x m matrix plus
  numel of each uncompressed tensor). That delta, in the bucket's dtype, costs 2 (W-1)/W.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)

from scape.comm import GRAD_VALUES, ByteCounter, ring_bytes_per_rank
from scape.peers.buckets import ddp_comm_hook, param_index

__all__ = ["CountedPowerSGD", "PowerSGDConfig", "powersgd_state"]

# Torch's tuning knobs, saved and checked on load (the memories' sizes depend on them).
_HYPER = (
    "matrix_approximation_rank",
    "start_powerSGD_iter",
    "min_compression_rate",
    "orthogonalization_epsilon",
    "use_error_feedback",
    "warm_start",
    "batch_tensors_with_same_shape",
)
_TENSOR_DICTS = ("error_dict", "p_memory_dict", "q_memory_dict")
_COUNTERS = (
    "iter",
    "total_numel_before_compression",
    "total_numel_after_compression",
    "compression_stats_logging_frequency",
    "next_stats_report",
)


@dataclass(frozen=True)
class PowerSGDConfig:
    rank: int = 1  # matrix_approximation_rank (1, 2, 4 in our sweeps)
    start_iter: int = 2  # vanilla all-reduce before this iteration
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.rank, int) and self.rank >= 1):
            raise ValueError(f"PowerSGDConfig.rank must be an int >= 1, got {self.rank!r}")
        if not (isinstance(self.start_iter, int) and self.start_iter >= 0):
            raise ValueError(
                f"PowerSGDConfig.start_iter must be an int >= 0, got {self.start_iter!r}"
            )
        # DDP rebuilds its buckets after iteration 1; memories made before would be stale.
        if (self.use_error_feedback or self.warm_start) and self.start_iter < 2:
            raise ValueError(
                f"PowerSGDConfig.start_iter must be >= 2 with error feedback or warm start, "
                f"got {self.start_iter}"
            )
        if not self.min_compression_rate > 0:
            raise ValueError(
                f"PowerSGDConfig.min_compression_rate must be > 0, got {self.min_compression_rate!r}"
            )


def powersgd_state(
    cfg: PowerSGDConfig, process_group: dist.ProcessGroup | None = None
) -> PowerSGDState:
    return PowerSGDState(
        process_group=process_group,
        matrix_approximation_rank=cfg.rank,
        start_powerSGD_iter=cfg.start_iter,
        min_compression_rate=cfg.min_compression_rate,
        use_error_feedback=cfg.use_error_feedback,
        warm_start=cfg.warm_start,
        random_seed=cfg.seed,
    )


class CountedPowerSGD:
    """State and hook: ``ddp.register_comm_hook(h, CountedPowerSGD.hook)``.

    Torch keys its error and P/Q memories by bucket index. A fresh DDP after a resume starts
    from registration-order buckets and rebuilds them after its first iteration, so a saved
    memory may meet a different bucket: when a bucket's layout differs from the one a memory
    was made for, that bucket's memories are dropped (torch restarts them: zero error, new
    random Q). Layouts are compared by parameter shapes, and by parameter positions too when
    ``params`` (the DDP module's ``parameters()``, in order) is given.
    """

    def __init__(
        self,
        cfg: PowerSGDConfig,
        process_group: dist.ProcessGroup | None = None,
        counter: ByteCounter | None = None,
        *,
        params: Iterable[Tensor] | None = None,
    ):
        self.cfg = cfg
        self.state = powersgd_state(cfg, process_group)
        self.counter = counter if counter is not None else ByteCounter()
        self._index = param_index(params)
        self._layouts: dict[int, tuple[Hashable, ...]] = {}  # bucket index -> its memories' layout

    def _layout(self, bucket: dist.GradBucket) -> tuple[Hashable, ...]:
        index = self._index or {}
        return tuple((index.get(id(p)), tuple(p.shape)) for p in bucket.parameters())

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.state.process_group)

    @staticmethod
    @ddp_comm_hook
    def hook(state: CountedPowerSGD, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        ps, buffer = state.state, bucket.buffer()
        W, itemsize = state.world_size, buffer.element_size()
        if ps.iter < ps.start_powerSGD_iter:  # torch all-reduces the bucket as is
            state.counter.add(GRAD_VALUES, 2 * ring_bytes_per_rank(buffer.numel() * itemsize, W))
            return powerSGD_hook(ps, bucket)
        idx, layout = bucket.index(), state._layout(bucket)
        if state._layouts.get(idx, layout) != layout:
            for memories in (ps.error_dict, ps.p_memory_dict, ps.q_memory_dict):
                memories.pop(idx, None)
        state._layouts[idx] = layout
        before = ps.total_numel_after_compression
        fut = powerSGD_hook(ps, bucket)
        sent = ps.total_numel_after_compression - before
        state.counter.add(GRAD_VALUES, 2 * ring_bytes_per_rank(sent * itemsize, W))
        # Torch issues the Q all-reduce from a callback of the P all-reduce. With two or more
        # buckets in flight those callbacks race, and ranks can issue bucket 1's P before or
        # after bucket 0's Q: gloo then pairs different collectives ("Received data size
        # doesn't match", seen with the Megatron GPT). Finishing each bucket before DDP hands
        # over the next keeps every rank's collective order the same.
        fut.wait()
        return fut

    def state_dict(self) -> dict:
        """Plain tensors, numbers and dicts (``torch.load(weights_only=True)`` reads it)."""
        ps = self.state
        name, keys, pos, has_gauss, cached_gaussian = ps.rng.get_state()
        out: dict = {k: getattr(ps, k) for k in _HYPER + _COUNTERS}
        out.update(
            {k: {i: t.detach().clone() for i, t in getattr(ps, k).items()} for k in _TENSOR_DICTS}
        )
        out["rng"] = {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
        out["layouts"] = {i: [list(x) for x in layout] for i, layout in self._layouts.items()}
        return out

    def load_state_dict(self, state: dict) -> None:
        ps = self.state
        for k in _HYPER:
            if state[k] != getattr(ps, k):
                raise ValueError(
                    f"checkpoint has PowerSGD {k}={state[k]!r}, this run {getattr(ps, k)!r}"
                )
        for k in _COUNTERS:
            setattr(ps, k, state[k])
        for k in _TENSOR_DICTS:
            setattr(ps, k, {int(i): t.clone() for i, t in state[k].items()})
        rng = state["rng"]
        ps.rng.set_state(
            (
                rng["name"],
                rng["keys"].numpy().astype(np.uint32),
                rng["pos"],
                rng["has_gauss"],
                rng["cached_gaussian"],
            )
        )
        self._layouts = {
            int(i): tuple((key, tuple(shape)) for key, shape in layout)
            for i, layout in state["layouts"].items()
        }
