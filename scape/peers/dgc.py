"""DGC-style top-k sparsification as a DDP comm hook (peer baseline).

Our implementation from the published description of Deep Gradient Compression (Lin et
al., ICLR 2018), not the authors' code. Per bucket and rank, with g this rank's local
gradient (n,) fp32:

    u = momentum * u + g             # momentum correction (skipped when momentum == 0)
    v = v + u                        # local accumulation (v = v + g when momentum == 0)
    I = top-k of |v|, k = ceil(density * n)  (num_selected; per tensor with ``per_tensor``)
    all-gather (I as int32, v[I] in the wire dtype) from every rank
    result = (sum over ranks r of scatter(I_r, v_r)) / W     # identical on every rank
    v[I] -= wire(v[I]), u[I] = 0     # error feedback (v[I] = 0 on an fp32 wire), momentum masking

The paper's warm-up density schedule is an option (``DGCConfig.warmup_steps``, off by
default: the density is then a constant): the density decays exponentially over the first
``warmup_steps`` steps, 25% -> 6.25% -> 1.5625% -> 0.39% in equal stages (the paper's 75%,
93.75%, 98.4375%, 99.6% sparsity, one stage per epoch), never below the target, then the
target. So is the paper's local gradient clipping (``DGCConfig.local_clip``, off by default):
each rank clips its own gradient to ``local_clip / sqrt(W)`` before accumulating it.
Sampling-based threshold estimation is left out: top-k is exact (``torch.topk``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from scape.comm import GRAD_VALUES, MASKS, ByteCounter, ring_bytes_per_rank
from scape.config import density_of
from scape.peers.buckets import ParamBuffers, ddp_comm_hook
from scape.shard import WIRE_DTYPES

__all__ = [
    "WARMUP_DENSITIES",
    "DGCConfig",
    "DGCHook",
    "accumulate_and_select_",
    "num_selected",
]

# Lin et al. 2018, "warm-up training": sparsity 75%, 93.75%, 98.4375%, 99.6% over the first
# epochs, exponentially increasing; as densities, 4^-1 .. 4^-4.
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.00390625)


def num_selected(size: int, density: float) -> int:
    """k = ceil(density * size), at least 1 and at most size.

    The product is rounded to 6 decimals first: 0.01 * 300 is 3.0000000000000004 in binary
    floating point and must give 3, not 4.
    """
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    return min(size, max(1, math.ceil(round(density * size, 6))))


def accumulate_and_select_(
    v: Tensor, u: Tensor | None, grad: Tensor, momentum: float, k: int, wire_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """DGC's local rule, in place, over the last dim of shapes (..., n): accumulate ``grad``,
    pick each row's top-k of |v|, leave behind what the wire cannot carry. Returns
    (idx (..., k) int64, distinct per row; the picked values (..., k) in ``wire_dtype``).

    ``u`` is the corrected momentum (None when momentum == 0), ``v`` the accumulated,
    not-yet-sent gradient. The hook calls it per bucket (n,) and the quality study's
    simulator per shard (W, n_shards, n): one rule, so the two cannot drift apart.
    """
    if u is not None:
        u.mul_(momentum).add_(grad)
        v.add_(u)
    else:
        v.add_(grad)
    idx = v.abs().topk(k, dim=-1, sorted=False).indices
    picked = v.gather(-1, idx)
    wire = picked.to(wire_dtype)
    # Exactly 0 on an fp32 wire, the rounding error on bf16: sent + residual is always the
    # accumulated input.
    v.scatter_(-1, idx, picked - wire.float())
    if u is not None:
        u.scatter_(-1, idx, 0.0)  # momentum factor masking
    return idx, wire


@dataclass(frozen=True)
class DGCConfig:
    density: float  # fraction of each bucket's entries each rank sends, (0, 1]
    momentum: float = 0.9  # momentum correction factor; 0 disables momentum correction
    value_dtype: str = "float32"  # dtype of the values on the wire: "float32" | "bfloat16"
    # The warm-up density schedule: steps over which the density decays through
    # ``warmup_densities`` (equal stages, each at least ``density``); 0 turns it off.
    warmup_steps: int = 0
    warmup_densities: tuple[float, ...] = WARMUP_DENSITIES
    # The paper's local gradient clipping: before a rank accumulates its gradient, it clips
    # it to norm ``local_clip / sqrt(W)`` (a bucket to its share, sqrt(bucket / all entries),
    # of that); the exchanged gradient is then not clipped again. 0 turns it off.
    local_clip: float = 0.0
    # The paper selects per layer (one threshold per tensor); False: one top-k over the
    # whole bucket, which starves tensors whose gradients are small next to the bucket's
    # largest (results/peers/dgc_screen/).
    per_tensor: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.local_clip, int | float) and self.local_clip >= 0.0):
            raise ValueError(f"DGCConfig.local_clip must be >= 0 (0: off), got {self.local_clip!r}")
        if not (isinstance(self.density, int | float) and 0.0 < self.density <= 1.0):
            raise ValueError(f"DGCConfig.density must be in (0, 1], got {self.density!r}")
        if not (isinstance(self.momentum, int | float) and 0.0 <= self.momentum < 1.0):
            raise ValueError(f"DGCConfig.momentum must be in [0, 1), got {self.momentum!r}")
        if self.value_dtype not in WIRE_DTYPES:
            raise ValueError(
                f"DGCConfig.value_dtype must be one of {sorted(WIRE_DTYPES)}, "
                f"got {self.value_dtype!r}"
            )
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(
                f"DGCConfig.warmup_steps must be an int >= 0, got {self.warmup_steps!r}"
            )
        if not self.warmup_densities or not all(
            isinstance(d, int | float) and 0.0 < d <= 1.0 for d in self.warmup_densities
        ):
            raise ValueError(
                f"DGCConfig.warmup_densities must be densities in (0, 1], got {self.warmup_densities!r}"
            )

    def density_at(self, step: int) -> float:
        """The density of step ``step`` (0 the first): a warm-up stage's while ``step <
        warmup_steps`` (stage ``step * stages // warmup_steps``, at least ``density``), else
        ``density`` itself."""
        if step < self.warmup_steps:
            stages = self.warmup_densities
            return max(stages[step * len(stages) // self.warmup_steps], self.density)
        return self.density

    @classmethod
    def for_sparsity(cls, sparsity: float, **fields: Any) -> DGCConfig:
        """From the sparsity a person writes (0.99: 1% of the entries sent)."""
        return cls(density=density_of(sparsity), **fields)


class DGCHook:
    """State and hook: ``ddp.register_comm_hook(h, DGCHook.hook)`` with ``h = DGCHook(cfg)``.

    ``params`` (the DDP module's ``parameters()``, in order) is needed only to save and load
    the state; the buffers follow parameters across DDP's bucket rebuilds either way.
    """

    def __init__(
        self,
        cfg: DGCConfig,
        process_group: dist.ProcessGroup | None = None,
        counter: ByteCounter | None = None,
        *,
        params: Iterable[Tensor] | None = None,
    ):
        self.cfg = cfg
        self.process_group = process_group
        self.counter = counter if counter is not None else ByteCounter()
        names = ("u", "v") if cfg.momentum > 0 else ("v",)
        params = None if params is None else list(params)
        self.buffers = ParamBuffers(names, params)
        # all entries of the model (local clipping's per-bucket share; 0: unknown, one bucket)
        self.total_numel = 0 if params is None else sum(p.numel() for p in params)
        self.step = 0  # steps whose last bucket this hook has exchanged (the warm-up's clock)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    @staticmethod
    @ddp_comm_hook
    def hook(state: DGCHook, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        grad = bucket.buffer()  # (n,) this rank's local gradient, DDP's flat bucket
        bufs = state.buffers.get(bucket)
        v, u = bufs["v"], bufs.get("u")  # (n,) fp32: accumulated-not-sent, corrected momentum
        density = state.cfg.density_at(state.step)
        if bucket.is_last():
            state.step += 1
        if state.cfg.local_clip > 0:
            share = grad.numel() / state.total_numel if state.total_numel else 1.0
            limit = state.cfg.local_clip * math.sqrt(min(share, 1.0) / state.world_size)
            grad.mul_((limit / (grad.norm() + 1e-6)).clamp(max=1.0))
        wire_dtype = WIRE_DTYPES[state.cfg.value_dtype]
        if state.cfg.per_tensor:  # the paper's rule: each tensor's own top fraction
            picks, start = [], 0
            for p in bucket.parameters():
                part = slice(start, start + p.numel())
                i, w = accumulate_and_select_(
                    v[part], None if u is None else u[part], grad[part], state.cfg.momentum,
                    num_selected(p.numel(), density), wire_dtype,
                )  # fmt: skip
                picks.append((i + start, w))
                start += p.numel()
            idx = torch.cat([i for i, _ in picks])
            wire = torch.cat([w for _, w in picks])
        else:
            idx, wire = accumulate_and_select_(
                v, u, grad, state.cfg.momentum, num_selected(v.numel(), density), wire_dtype
            )  # (k,) int64, (k,) wire dtype
        k = idx.numel()  # the same on every rank: the same tensors and density

        W, group = state.world_size, state.process_group
        all_idx = torch.empty(W * k, dtype=torch.int32, device=v.device)
        all_val = torch.empty(W * k, dtype=wire.dtype, device=v.device)
        state.counter.add(MASKS, ring_bytes_per_rank(all_idx.numel() * 4, W))
        state.counter.add(
            GRAD_VALUES, ring_bytes_per_rank(all_val.numel() * wire.element_size(), W)
        )
        works = [
            dist.all_gather_into_tensor(all_idx, idx.to(torch.int32), group=group, async_op=True),
            dist.all_gather_into_tensor(all_val, wire, group=group, async_op=True),
        ]

        def average(fut: torch.futures.Future) -> Tensor:
            for done in fut.value():
                done.wait()  # re-raises a failed all-gather here rather than averaging garbage
            out = torch.zeros(grad.numel(), dtype=torch.float32, device=grad.device)
            # One scatter per rank, in rank order: a rank's indices are distinct, so no index
            # is added twice within a call and the sum is the same on every rank (and device).
            for r in range(W):
                part = slice(r * k, (r + 1) * k)
                out.index_add_(0, all_idx[part].long(), all_val[part].float())
            grad.copy_(out.div_(W))
            return grad

        futs = [w.get_future() for w in works]
        return torch.futures.collect_all(futs).then(average)

    def state_dict(self) -> dict:
        return {"buffers": self.buffers.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.buffers.load_state_dict(state["buffers"])
        self.step = int(state.get("step", 0))  # checkpoints from before the warm-up option
