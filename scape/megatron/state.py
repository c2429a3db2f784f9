"""What one rank holds for SCAPE inside Megatron, and the two exchanges over it.

Shared by the bucket groups (which pack each bucket at its mask and start the all-reduce of
the values during backward) and the optimizer (which does the arithmetic with the pure
functions of :mod:`scape.shard`, exactly as the simulator does).

Per rank, for the whole flat buffer (N entries, Megatron's layout):
  moment (N,) fp32         this rank's own first moment of its own gradients
  second_moment (N,) fp32  rebuilt from the synchronized buffer (``update="rms"``), replicated
  main (N,) fp32           the params every rank updates in full (the param buffer itself for
                           fp32 models, a separate copy for bf16 ones), replicated
Megatron's grad buffer receives only the fresh gradient and is zeroed every step as usual;
the moment is kept apart, so a non-finite step is dropped without touching it.
Masks: ``masks[b]`` (W, n_b) int64 chunk offsets of bucket b's W shards, the same on every
rank, for the coming step; shard j's row was made by rank j (its owner).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.profiler import record_function

from scape.basis import ShardBasis
from scape.comm import ByteCounter, SparseCommunicator
from scape.config import ScapeConfig
from scape.megatron.layout import BucketShard
from scape.shard import accumulate, all_finite, owner_mask, pack

__all__ = ["ScapeState", "WaitAll"]


class ScapeState:
    def __init__(
        self,
        config: ScapeConfig,
        shards: list[BucketShard],
        *,
        group,
        device: torch.device,
        counter: ByteCounter | None = None,
    ) -> None:
        self.config = config
        self.shards = shards
        self.comm = SparseCommunicator(group, counter)
        self.rank, self.world_size = self.comm.rank, self.comm.world_size
        self.device = device
        starts = [0] + [s.end for s in shards[:-1]]
        if [s.start for s in shards] != starts:
            raise ValueError(
                f"buckets must tile the buffer from 0: starts {[s.start for s in shards]}"
            )
        self.bases = [ShardBasis(s.size, config.chunk, config.k, device) for s in shards]
        total = shards[-1].end
        self.moment = torch.zeros(total, dtype=torch.float32, device=device)
        self.second_moment = (
            torch.zeros(total, dtype=torch.float32, device=device)
            if config.update == "rms"
            else None
        )
        # this step's candidate moments, bucket by bucket (reused: a fresh (N,) buffer every
        # step would cost its page faults on CPU)
        self.candidate = torch.zeros_like(self.moment)
        self.main: Tensor | None = None  # set by the optimizer (it knows the param buffer)
        self.step = 0  # steps taken, skipped ones included (as the simulator counts)
        self.updates = 0  # accepted steps: the rebuilt second moment's bias correction
        self.masks: list[Tensor] | None = None  # for the coming step; None: not known yet
        self._pending: tuple | None = None  # (gathered, work) of a mask all-gather
        # Per-step transport, filled bucket by bucket during backward.
        n = len(shards)
        self.dense: bool | None = None  # this step sends everything (warm-up)
        self.wires: list[Tensor | None] = [None] * n
        self.payloads: list[Tensor | None] = [None] * n  # wire + finite flag, reduced in place
        self._fused: _FusedExchange | None = None
        self.last_used_masks: list[Tensor] | None = None

    # ------------------------------------------------------------------ masks
    def own_range(self, b: int) -> tuple[int, int]:
        return self.shards[b].shard_range(self.rank)

    def start_next_masks(self, statistic: Tensor) -> None:
        """This rank's masks of its own shards for the next step, from ``statistic`` (its
        committed moment, or after a dense step the candidate it just sent in full), all-
        gathered asynchronously so that the exchange hides behind the next forward/backward.
        One byte per selected coefficient (chunk offsets are below 256)."""
        own = []
        for b in range(len(self.shards)):
            lo, hi = self.own_range(b)
            own.append(owner_mask(self.bases[b], statistic[lo:hi]).to(torch.uint8))
        self.masks = None
        gathered, work = self.comm.all_gather_masks(torch.cat(own), async_op=True)
        self._pending = (gathered, work)

    def finish_mask_exchange(self) -> None:
        if self._pending is None:
            return
        gathered, work = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        per_rank = gathered.view(self.world_size, -1).long()
        self.masks, offset = [], 0
        for basis in self.bases:
            self.masks.append(per_rank[:, offset : offset + basis.num_selected].contiguous())
            offset += basis.num_selected

    def step_is_dense(self) -> bool:
        """Whether the step being run sends everything: the warm-up, or no masks yet (only
        after a skipped last warm-up step)."""
        if self.dense is None:
            self.finish_mask_exchange()
            step = self.step + 1
            self.dense = step <= self.config.dense_warmup_steps or self.masks is None
        return self.dense

    # ------------------------------------------------------------------ the values
    @record_function("scape.pack")
    def pack_bucket(self, b: int, grad: Tensor) -> Tensor:
        """Candidate moment of bucket ``b`` and this rank's packed values at the masks, plus
        one flag entry (0, or inf if any of this rank's candidate entries is not finite) that
        the sum carries to every rank: a skip decision with no extra collective."""
        shard = self.shards[b]
        cand = accumulate(self.moment[shard.start : shard.end], grad, self.config.moment_beta,
                          out=self.candidate[shard.start : shard.end])  # fmt: skip
        dense = self.step_is_dense()
        wire = pack(
            None if dense else self.bases[b],
            cand,
            None if dense else self.masks[b],
            world_size=self.world_size,
            value_dtype=self.config.value_dtype,
        )
        flag = torch.where(all_finite(cand), 0.0, float("inf")).to(wire.dtype)
        self.wires[b] = wire
        self.payloads[b] = torch.cat([wire, flag.reshape(1)])
        return self.payloads[b]

    def start_grad_exchange(self, b: int, grad: Tensor, *, async_op: bool):
        """Pack bucket ``b`` and start its all-reduce (or, fused, the one all-reduce of every
        bucket once the last one is packed). Returns a handle with ``wait()``, or None."""
        payload = self.pack_bucket(b, grad)
        if not self.config.fuse_buckets:
            _, work = self.comm.all_reduce_values(payload, async_op=async_op)
            return work
        if self._fused is None:
            self._fused = _FusedExchange(self)
        self._fused.packed += 1
        if self._fused.packed == len(self.shards):
            self._fused.start(async_op=async_op)
        return self._fused

    def synced(self, b: int) -> Tensor:
        """Bucket ``b``'s summed values (without the flag), after the exchange finished."""
        if self._fused is not None:
            self._fused.wait(require=True)
        return self.payloads[b][:-1]

    def step_is_finite(self) -> bool:
        if self._fused is not None:
            self._fused.wait(require=True)
        return all(bool(torch.isfinite(p).all()) for p in self.payloads)

    def clear_step(self) -> None:
        """Forget this step's transport buffers."""
        n = len(self.shards)
        self.dense = None
        self.wires, self.payloads = [None] * n, [None] * n
        self._fused = None


class _FusedExchange:
    """One all-reduce of all buckets' payloads, concatenated in bucket order; every bucket
    group's handle is this object, so Megatron's ``finish_grad_sync`` waits on it.

    On a first batch Megatron starts and waits on the bucket groups one by one, so a wait can
    come before the last bucket is packed: it then returns at once (nothing reads a bucket's
    values before the optimizer step, which waits for real, ``require=True``)."""

    def __init__(self, state: ScapeState) -> None:
        self.state, self.packed = state, 0
        self.buffer: Tensor | None = None
        self.work = None
        self.done = False

    def start(self, *, async_op: bool) -> None:
        st = self.state
        self.buffer = torch.cat(st.payloads)
        _, self.work = st.comm.all_reduce_values(self.buffer, async_op=async_op)
        if not async_op:
            self.wait()

    def wait(self, *, require: bool = False) -> None:
        if self.done:
            return
        if self.buffer is None:
            if require:
                raise RuntimeError("the optimizer step came before every bucket was packed")
            return
        if self.work is not None:
            self.work.wait()
        offset = 0
        for p in self.state.payloads:
            p.copy_(self.buffer[offset : offset + p.numel()])
            offset += p.numel()
        self.done = True


class WaitAll:
    """One handle for several collectives (Megatron keeps one handle per bucket group)."""

    def __init__(self, handles: list) -> None:
        unique = []
        for h in handles:
            if h is not None and all(h is not u for u in unique):
                unique.append(h)
        self.handles = unique

    def wait(self) -> None:
        for h in self.handles:
            h.wait()
