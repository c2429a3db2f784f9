"""What one rank holds for SCAPE inside Megatron, and the three sparse exchanges over it.

Shared by the bucket groups (which move data: pack + reduce-scatter during backward, sparse
all-gather of params after the step) and the optimizer (which does the arithmetic, with the
pure functions of :mod:`scape.shard`, exactly as the simulator does).

Per rank, for the whole flat buffer (N entries, Megatron's layout):
  residual (N,) fp32   unsent gradient mass. Megatron's grad buffer receives only the fresh
                       gradient and is zeroed every step as usual; the residual is kept apart
                       so that a non-finite step can be dropped without touching it (an
                       in-buffer residual cannot be recovered once a NaN has been added).
Per owned shard (one per bucket, S_b entries):
  main (S_b,) fp32     the fp32 main params (a view of the param buffer for fp32 models)
  exp_avg (S_b,) fp32  AdamS's first moment;  age (S_b,) int32  steps since last sent
Masks: ``masks[b][j]`` the sorted int64 mask of shard j of bucket b, the same on every rank.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scape.comm import ByteCounter, SparseCommunicator, bucket_positions
from scape.config import ScapeConfig
from scape.encoding import decode_mask, encode_mask, encoded_nbytes, resolve_encoding
from scape.masks import num_selected
from scape.megatron.layout import BucketShard
from scape.shard import next_mask, pack_values

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
        self.k = [num_selected(s.size, config.density) for s in shards]
        self.encodings = [
            resolve_encoding(config.mask_encoding, s.size, k)
            for s, k in zip(shards, self.k, strict=True)
        ]
        self.residual = torch.zeros(shards[-1].end, dtype=torch.float32, device=device)
        self.main: list[Tensor] = []  # filled by the optimizer (it knows the param buffer)
        self.exp_avg = [torch.zeros(s.size, device=device) for s in shards]
        self.age = [torch.zeros(s.size, dtype=torch.int32, device=device) for s in shards]
        self.step = 0  # steps taken, skipped ones included (as the simulator counts)
        self.masks: list[list[Tensor]] | None = None  # for the coming step; None: not known yet
        self._pending: tuple | None = None  # (gathered, work, buckets) of a mask all-gather
        # Per-step transport results, filled bucket by bucket during backward.
        n = len(shards)
        self.used_masks: list[list[Tensor] | None] = [None] * n
        self.positions: list[Tensor | None] = [None] * n
        self.wires: list[Tensor | None] = [None] * n
        self.synced: list[Tensor | None] = [None] * n
        self.last_used_masks: list[list[Tensor]] | None = None  # of the last step, for studies
        # Updated params waiting for the sparse all-gather: (values, positions) per bucket.
        self.param_updates: list[tuple[Tensor, Tensor] | None] = [None] * n

    # ------------------------------------------------------------------ masks
    def own_range(self, b: int) -> tuple[int, int]:
        return self.shards[b].shard_range(self.rank)

    def is_dense(self, step: int) -> bool:
        return step <= self.config.dense_warmup_steps

    def own_mask(self, b: int, *, step: int, local_accum: Tensor) -> Tensor:
        return next_mask(
            self.config,
            exp_avg=self.exp_avg[b],
            local_accum=local_accum,
            age=self.age[b],
            step=step,
            shard_id=b * self.world_size + self.rank,
        )

    def exchange_masks(self, buckets: list[int], own: list[Tensor], *, async_op: bool) -> None:
        """All-gather this rank's encoded masks for ``buckets``; every rank decodes all."""
        payload = torch.cat(
            [
                encode_mask(m, self.shards[b].size, self.encodings[b])
                for b, m in zip(buckets, own, strict=True)
            ]
        )
        gathered, work = self.comm.all_gather_masks(payload, async_op=async_op)
        self._pending = (gathered, work, buckets)
        if not async_op:
            self.finish_mask_exchange()

    def finish_mask_exchange(self) -> None:
        if self._pending is None:
            return
        gathered, work, buckets = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        if self.masks is None:
            self.masks = [None] * len(self.shards)
        per_rank = gathered.numel() // self.world_size
        for j in range(self.world_size):
            chunk = gathered[j * per_rank : (j + 1) * per_rank]
            offset = 0
            for b in buckets:
                s, k, enc = self.shards[b].size, self.k[b], self.encodings[b]
                n = encoded_nbytes(s, k, enc)
                mask = decode_mask(chunk[offset : offset + n].clone(), s, k, enc)
                offset += n
                if j == 0:
                    self.masks[b] = [None] * self.world_size
                self.masks[b][j] = mask

    def start_next_masks(self, step: int) -> None:
        """Owner's masks for ``step`` from m, its residual and age; exchanged asynchronously
        so that the all-gather hides behind the next step's forward and backward."""
        buckets = list(range(len(self.shards)))
        own = []
        for b in buckets:
            lo, hi = self.own_range(b)
            own.append(self.own_mask(b, step=step, local_accum=self.residual[lo:hi]))
        self.masks = None
        self.exchange_masks(buckets, own, async_op=True)

    def bucket_masks(self, b: int, grad: Tensor) -> list[Tensor]:
        """The W masks of bucket ``b`` for the step being run (``grad``: its fresh gradient)."""
        step, shard = self.step + 1, self.shards[b]
        if self.is_dense(step):
            full = torch.arange(shard.size, device=self.device)
            return [full] * self.world_size
        if not self.config.delay_mask:
            # Undelayed (ablation): from this step's local buffer, exchanged on the critical path.
            lo, hi = self.own_range(b)
            accum = self.residual[lo:hi] + grad[lo - shard.start : hi - shard.start]
            self.exchange_masks(
                [b], [self.own_mask(b, step=step, local_accum=accum)], async_op=False
            )
            return self.masks[b]
        self.finish_mask_exchange()
        if self.masks is None:
            # Only after a skipped step that should have produced the first masks: make them
            # now, as the end of that step would have (from m, residual and age).
            self.start_next_masks(step)
            self.finish_mask_exchange()
        return self.masks[b]

    # ------------------------------------------------------------------ gradients
    def start_grad_exchange(self, b: int, grad: Tensor, *, async_op: bool):
        """Pack bucket ``b`` at the mask ((residual + fresh) / W) and reduce-scatter it."""
        shard = self.shards[b]
        masks = self.bucket_masks(b, grad)
        positions = bucket_positions(masks, shard.size)
        wire = pack_values(
            self.residual[shard.start : shard.end],
            grad,
            positions,
            world_size=self.world_size,
            value_dtype=self.config.value_dtype,
        )
        synced, work = self.comm.reduce_scatter(wire, async_op=async_op)
        self.used_masks[b], self.positions[b], self.wires[b], self.synced[b] = (
            masks,
            positions,
            wire,
            synced,
        )
        return work

    # ------------------------------------------------------------------ params
    def start_param_exchange(self, b: int, param_data: Tensor, *, async_op: bool):
        """All-gather the owners' updated entries of bucket ``b``; returns a handle whose
        ``wait()`` writes them into ``param_data`` (None when there is nothing to send)."""
        update = self.param_updates[b]
        if update is None:
            return None
        self.param_updates[b] = None
        values, positions = update
        gathered, work = self.comm.all_gather(values, async_op=async_op)
        handle = _ScatterOnWait(work, param_data, positions, gathered)
        if not async_op:
            handle.wait()
            return None
        return handle

    def clear_step(self) -> None:
        """Forget this step's transport buffers (the masks used stay in ``last_used_masks``)."""
        if any(m is not None for m in self.used_masks):
            self.last_used_masks = self.used_masks
        n = len(self.shards)
        self.used_masks, self.positions = [None] * n, [None] * n
        self.wires, self.synced = [None] * n, [None] * n


class _ScatterOnWait:
    """A collective's handle whose ``wait()`` also writes the gathered values in place, so
    Megatron's ``finish_param_sync`` (which only calls ``wait()``) works unchanged."""

    def __init__(self, work, target: Tensor, positions: Tensor, values: Tensor) -> None:
        self.work, self.target, self.positions, self.values = work, target, positions, values
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        if self.work is not None:
            self.work.wait()
        self.target[self.positions] = self.values
        self.done = True


class WaitAll:
    """One handle for several collectives (Megatron keeps one handle per bucket group)."""

    def __init__(self, handles: list) -> None:
        self.handles = [h for h in handles if h is not None]

    def wait(self) -> None:
        for h in self.handles:
            h.wait()
