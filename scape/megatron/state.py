"""What one rank holds for SCAPE inside Megatron, and the two exchanges over it.

Shared by the bucket groups (which pack each bucket at its mask and start the all-reduce of
the values during backward) and the optimizer (which finishes the step bucket by bucket). The
arithmetic is one :class:`scape.step.BucketStep` per bucket, the same objects the simulator
holds per worker: ``blocked`` on CPU, ``fused`` Triton kernels on CUDA.

Per rank, for the whole flat buffer (N entries, Megatron's layout):
  moment (N,) fp32         this rank's own first moment of its own gradients
  second_moment (N,) fp32  rebuilt from the synchronized buffer (``update="rms"``), replicated
  main (N,) fp32           the params every rank updates in full (the param buffer itself for
                           fp32 models, a separate copy for bf16 ones, which Megatron's own
                           fp32 main params then view), replicated
Megatron's grad buffer receives only the fresh gradient and is zeroed every step as usual;
the moment is kept apart, so a non-finite step is dropped without touching it.

Sized once, for the largest k (and again for the config's k when a density ramp ends): the
payloads of every bucket (values and a finite flag, in the wire dtype) are views of one
buffer, which a fused exchange all-reduces in place; the owner's masks are written into one
send buffer and gathered into one of two receive buffers (the masks in use stay readable
while the next step's arrive). ``masks[b]`` (W, n_b) uint8 chunk offsets of
bucket b's W shards, the same on every rank, for the coming step; shard j's row was made by
rank j (its owner). Only the dense warm-up allocates per step (its payloads hold every entry).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.profiler import record_function

from scape.basis import selected_count
from scape.comm import ByteCounter, SparseCommunicator
from scape.config import ScapeConfig
from scape.megatron.layout import BucketShard
from scape.shard import WIRE_DTYPES, all_finite
from scape.step import Geometry, Scratch, make_bucket_step, resolve_implementation

__all__ = ["ScapeState", "WaitAll"]


class ScapeState:
    def __init__(
        self,
        config: ScapeConfig,
        shards: list[BucketShard],
        *,
        group,
        device: torch.device,
        grad_buffer: Tensor,
        decay_runs: list[list[tuple[int, int]]],
        eps: float,
        counter: ByteCounter | None = None,
        implementation: str | None = None,
    ) -> None:
        self.config = config
        self.shards = shards
        self.comm = SparseCommunicator(group, counter)
        self.rank, self.world_size = self.comm.rank, self.comm.world_size
        self.device = device
        self.grad_buffer = grad_buffer  # Megatron's, (N,): every bucket's fresh gradient
        starts = [0] + [s.end for s in shards[:-1]]
        if [s.start for s in shards] != starts:
            raise ValueError(
                f"buckets must tile the buffer from 0: starts {[s.start for s in shards]}"
            )
        self.implementation = resolve_implementation(implementation, device)
        scratch = Scratch()  # one temporary for every bucket's select, sized once
        self.steps = [
            make_bucket_step(self.implementation,
                             Geometry(s.size, self.world_size, config.chunk, config.k),
                             self.rank, config, device, runs, eps, scratch)
            for s, runs in zip(shards, decay_runs, strict=True)
        ]  # fmt: skip
        self.bases = [step.basis for step in self.steps]
        total = shards[-1].end
        self.moment = torch.zeros(total, dtype=torch.float32, device=device)
        self.second_moment = (
            torch.zeros(total, dtype=torch.float32, device=device)
            if config.update == "rms"
            else None
        )
        self.main: Tensor | None = None  # set by the optimizer (it knows the param buffer)
        self.step = 0  # steps taken, skipped ones included (as the simulator counts)
        self.updates = 0  # accepted steps: the rebuilt second moment's bias correction
        self.wire_dtype = WIRE_DTYPES[config.value_dtype]
        # A density ramp (config.ramp_start_k) changes k from step to step, and a step sends
        # at the k its masks were made for: the buffers are sized for the largest k, and sized
        # again for the config's k once the ramp is over (the ramp's first k is up to 10x it).
        self._offsets_by_k: dict[int, list[int]] = {}
        self._recv_next = 0  # which receive buffer the next exchange fills
        self._size_buffers(max(config.k_levels))
        self.masks: list[Tensor] | None = None  # for the coming step; None: not known yet
        self.mask_k = config.k  # k of ``masks``
        self._next_k = config.k  # k of the masks this step makes
        self.last_used_masks: list[Tensor] | None = None
        self._pending = None  # the work of a mask all-gather in flight
        # Per-step transport, filled bucket by bucket during backward.
        self.dense: bool | None = None  # this step sends everything (warm-up)
        self.payload: Tensor | None = None  # every bucket's payload, reduced in place
        self.payloads: list[Tensor] | None = None  # bucket b's view of it
        self._fused: _FusedExchange | None = None

    def _size_buffers(self, k: int) -> None:
        """Allocate the sparse payload (every bucket's values and flag, views of one buffer)
        and the mask buffers (this rank's own masks back to back, and two receive buffers of
        everyone's) for masks of up to ``k`` per chunk."""
        self.buffer_k = k
        self._sparse_payload = torch.empty(
            sum(self.world_size * self.mask_count(b, k) + 1 for b in range(len(self.shards))),
            dtype=self.wire_dtype, device=self.device,
        )  # fmt: skip
        n_masks = self._mask_offsets(k)[-1]
        self._mask_send = torch.empty(n_masks, dtype=torch.uint8, device=self.device)
        self._mask_recv = [torch.empty(self.world_size * n_masks, dtype=torch.uint8,
                                       device=self.device) for _ in range(2)]  # fmt: skip

    def _release_ramp_buffers(self) -> None:
        """Size the buffers for the config's k once the ramp is over (k only falls, so no
        later step needs more); the masks in use move to the new receive buffer."""
        in_use, k = self.masks, self.mask_k
        self._size_buffers(self.config.k)
        self.set_masks(in_use, k)

    # ------------------------------------------------------------------ masks
    def own_range(self, b: int) -> tuple[int, int]:
        return self.shards[b].shard_range(self.rank)

    def mask_count(self, b: int, k: int) -> int:
        """Coefficients in one shard's mask of bucket ``b`` at ``k`` per chunk."""
        return selected_count(self.shards[b].size, self.config.chunk, k)

    def _mask_offsets(self, k: int) -> list[int]:
        """Where each bucket's mask starts in a rank's row of masks at ``k`` (and the end);
        computed once per k (every bucket's mask asks for them, every step)."""
        if k not in self._offsets_by_k:
            offsets = [0]
            for b in range(len(self.shards)):
                offsets.append(offsets[-1] + self.mask_count(b, k))
            self._offsets_by_k[k] = offsets
        return self._offsets_by_k[k]

    def next_mask_out(self, b: int) -> Tensor:
        """Where this rank writes its mask of its own shard of bucket ``b`` for the next step."""
        offsets = self._mask_offsets(self._next_k)
        return self._mask_send[offsets[b] : offsets[b + 1]]

    def start_mask_exchange(self) -> None:
        """All-gather the masks this rank made of its own shards (every bucket's written into
        :meth:`next_mask_out`), asynchronously, so that the exchange hides behind the next
        forward/backward. One byte per selected coefficient (chunk offsets are below 256)."""
        self.masks = None
        n = self._mask_offsets(self._next_k)[-1]
        recv = self._mask_recv[self._recv_next][: self.world_size * n]
        _, work = self.comm.all_gather_masks(self._mask_send[:n], out=recv, async_op=True)
        self._pending = (recv, work, self._next_k)

    def finish_mask_exchange(self) -> None:
        if self._pending is None:
            return
        recv, work, k = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        self._set_masks_from(recv, k)
        self._recv_next = 1 - self._recv_next

    def _set_masks_from(self, recv: Tensor, k: int) -> None:
        offsets = self._mask_offsets(k)
        per_rank = recv[: self.world_size * offsets[-1]].view(self.world_size, -1)
        self.masks = [per_rank[:, lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:], strict=True)]
        self.mask_k = k

    def set_masks(self, masks: list[Tensor] | None, k: int | None = None) -> None:
        """Install masks (W, n_b) per bucket made at ``k`` per chunk (None: the config's), e.g.
        from a checkpoint."""
        self.finish_mask_exchange()
        if masks is None:
            self.masks = None
            return
        k = self.config.k if k is None else k
        if k > self.buffer_k:  # masks of a ramp's larger k into buffers sized after it
            self._size_buffers(k)
        offsets = self._mask_offsets(k)
        recv = self._mask_recv[self._recv_next]
        per_rank = recv[: self.world_size * offsets[-1]].view(self.world_size, -1)
        for lo, hi, m in zip(offsets[:-1], offsets[1:], masks, strict=True):
            per_rank[:, lo:hi].copy_(m)
        self._set_masks_from(recv, k)
        self._recv_next = 1 - self._recv_next

    def step_is_dense(self) -> bool:
        """Whether the step being run sends everything: the warm-up, or no masks yet (only
        after a skipped last warm-up step)."""
        if self.dense is None:
            self.finish_mask_exchange()
            step = self.step + 1
            self.dense = step <= self.config.dense_warmup_steps or self.masks is None
        return self.dense

    # ------------------------------------------------------------------ the values
    def _open_payloads(self) -> None:
        """This step's payload views: the sparse buffer; in the warm-up a dense one, or the
        grad buffer itself where the implementation reduces it in place."""
        dense = self.step_is_dense()
        if self.config.ramp_start_k:  # the masks' k now, the schedule's for the ones made now
            self._next_k = self.config.k_at(self.step + 2)  # the step being run is step + 1
            k = self.config.k if dense else self.mask_k
            for step in self.steps:
                step.set_k(k, self._next_k)
            # the ramp is over where the steps' own set_k says so: k only falls
            if k == self._next_k == self.config.k and self.buffer_k > self.config.k:
                self._release_ramp_buffers()
        sizes = [step.payload_numel(dense) for step in self.steps]
        if not dense:
            self.payload = self._sparse_payload[: sum(sizes)]
        elif self.steps[0].payload_is_grad(dense):
            self.payload = self.grad_buffer
        else:
            self.payload = torch.empty(sum(sizes), dtype=self.wire_dtype, device=self.device)
        self.payloads = list(self.payload.split(sizes))

    def makes_masks(self) -> bool:
        """Whether the step being run makes the next step's masks (from its last warm-up
        step on)."""
        return self.step + 1 >= self.config.dense_warmup_steps

    @record_function("scape.pack")
    def pack_bucket(self, b: int, grad: Tensor) -> Tensor:
        """This rank's values of bucket ``b`` at the masks (every entry in the warm-up), plus
        one flag entry (0, or inf if any of this rank's candidate entries is not finite) that
        the sum carries to every rank: a skip decision with no extra collective."""
        if self.payloads is None:
            self._open_payloads()
        shard = self.shards[b]
        masks = None if self.dense else self.masks[b]
        self.steps[b].pack(self.moment[shard.start : shard.end], grad, masks, self.payloads[b],
                           next_mask=self.next_mask_out(b) if self.makes_masks() else None)  # fmt: skip
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
        return self.steps[b].values(self.payloads[b], self.dense)

    def synced_all(self) -> list[Tensor]:
        return [self.synced(b) for b in range(len(self.shards))]

    def step_is_finite(self) -> bool:
        """Every bucket's summed values and flags finite: one sum over the payload buffer and
        one host sync (:func:`scape.shard.all_finite`, no bucket-sized temporary)."""
        if self._fused is not None:
            self._fused.wait(require=True)
        return bool(all_finite(self.payload))

    def clear_step(self) -> None:
        """Forget this step's transport (a dense warm-up's payloads are freed)."""
        self.dense = None
        self.payload = self.payloads = None
        self._fused = None


class _FusedExchange:
    """One all-reduce of every bucket's payload: they are views of one buffer, reduced in
    place. Every bucket group's handle is this object, so Megatron's ``finish_grad_sync``
    waits on it.

    On a first batch Megatron starts and waits on the bucket groups one by one, so a wait can
    come before the last bucket is packed: it then returns at once (nothing reads a bucket's
    values before the optimizer step, which waits for real, ``require=True``)."""

    def __init__(self, state: ScapeState) -> None:
        self.state, self.packed = state, 0
        self.started = False
        self.work = None
        self.done = False

    def start(self, *, async_op: bool) -> None:
        _, self.work = self.state.comm.all_reduce_values(self.state.payload, async_op=async_op)
        self.started = True
        if not async_op:
            self.wait()

    def wait(self, *, require: bool = False) -> None:
        if self.done:
            return
        if not self.started:
            if require:
                raise RuntimeError("the optimizer step came before every bucket was packed")
            return
        if self.work is not None:
            self.work.wait()
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
