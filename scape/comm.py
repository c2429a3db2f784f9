"""The collectives SCAPE issues over a process group, each counting the bytes it sends.

(What goes into them, the values at the masks, is packed by :mod:`scape.step`.)

Byte accounting is per rank and per collective, for ring algorithms: a reduce-scatter
whose input is T bytes, or an all-gather whose output is T bytes, makes each rank send
(W - 1) / W * T bytes. For large W that is the reference doc's table (e.g. a dense bf16
reduce-scatter of N params costs 2N per rank).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.distributed as dist
from torch import Tensor

__all__ = [
    "ByteCounter",
    "SparseCommunicator",
    "ring_bytes_per_rank",
    "step_bytes_per_rank",
]

# The kinds of traffic the counters separate (the benchmark tables use these names).
GRAD_VALUES, PARAM_VALUES, MASKS, SCALARS = "grad_values", "param_values", "masks", "scalars"


def ring_bytes_per_rank(total_nbytes: int, world_size: int) -> float:
    """Bytes one rank sends in a ring reduce-scatter (input) or all-gather (output) of T bytes."""
    return total_nbytes * (world_size - 1) / world_size if world_size > 1 else 0.0


def step_bytes_per_rank(
    values_per_shard: Sequence[int], world_size: int, value_nbytes: int, *, masks: bool
) -> dict[str, float]:
    """Bytes one rank sends in one SCAPE step, by kind, as :class:`SparseCommunicator` counts
    them: for every bucket whose W shards each send ``values_per_shard[b]`` values, one all-
    reduce of those ``W * n_b`` values and the bucket's finite flag (booked half as its reduce-
    scatter, half as its all-gather); with ``masks``, the all-gather of one step's masks, one
    byte per selected coefficient (the Megatron adapter books it at the step that sends it, a
    step ahead; the simulator at the step that uses it). A dense warm-up step sends whole
    shards (n_b = shard size). Fusing the buckets' all-reduces changes calls, not bytes."""
    values = sum(world_size * n + 1 for n in values_per_shard) * value_nbytes
    mask_bytes = sum(world_size * n for n in values_per_shard) if masks else 0
    return {
        GRAD_VALUES: ring_bytes_per_rank(values, world_size),
        PARAM_VALUES: ring_bytes_per_rank(values, world_size),
        MASKS: ring_bytes_per_rank(mask_bytes, world_size),
        SCALARS: 0.0,
    }


@dataclass
class ByteCounter:
    """Bytes sent by this rank, accumulated per kind of traffic."""

    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, kind: str, nbytes: float) -> None:
        self.totals[kind] += nbytes

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)

    def reset(self) -> None:
        self.totals.clear()

    @property
    def total(self) -> float:
        return float(sum(self.totals.values()))


class SparseCommunicator:
    """The collectives of one SCAPE step over ``group``; every call counts its bytes.

    Values are packed shard-major at masks every rank already holds, so no indices travel
    with them; the masks themselves travel once, a step ahead, in their own all-gather.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.counter = counter if counter is not None else ByteCounter()

    def _count(self, kind: str, tensor: Tensor) -> None:
        self.counter.add(
            kind, ring_bytes_per_rank(tensor.numel() * tensor.element_size(), self.world_size)
        )

    def reduce_scatter(
        self, packed: Tensor, *, kind: str = GRAD_VALUES, async_op: bool = False
    ) -> tuple[Tensor, dist.Work | None]:
        """Sum-reduce ``packed`` (W*k,) across ranks; this rank gets its (k,) chunk."""
        if packed.numel() % self.world_size:
            raise ValueError(
                f"packed length {packed.numel()} is not a multiple of W={self.world_size}"
            )
        out = packed.new_empty(packed.numel() // self.world_size)
        self._count(kind, packed)
        work = dist.reduce_scatter_tensor(out, packed, group=self.group, async_op=async_op)
        return out, work

    def all_gather(
        self,
        local: Tensor,
        *,
        kind: str = PARAM_VALUES,
        async_op: bool = False,
        out: Tensor | None = None,
    ) -> tuple[Tensor, dist.Work | None]:
        """Concatenate every rank's ``local`` (k,) in rank order -> (W*k,), into ``out`` when
        given (a buffer sized once)."""
        if out is None:
            out = local.new_empty(local.numel() * self.world_size)
        self._count(kind, out)
        work = dist.all_gather_into_tensor(
            out, local.contiguous(), group=self.group, async_op=async_op
        )
        return out, work

    def all_reduce_values(
        self, payload: Tensor, *, async_op: bool = False
    ) -> tuple[Tensor, dist.Work | None]:
        """In-place sum of the packed values: the one synchronized sparse buffer. Booked as a
        ring all-reduce is made, half reduce-scatter (gradient sync) and half all-gather (what
        the abstract calls parameter reconstruction)."""
        self._count(GRAD_VALUES, payload)
        self._count(PARAM_VALUES, payload)
        work = dist.all_reduce(payload, group=self.group, async_op=async_op)
        return payload, work

    def all_gather_masks(
        self, payload: Tensor, *, out: Tensor | None = None, async_op: bool = True
    ) -> tuple[Tensor, dist.Work | None]:
        """All-gather encoded mask bytes (uint8); asynchronous by default (it hides behind compute)."""
        return self.all_gather(payload, kind=MASKS, async_op=async_op, out=out)
