"""Read Megatron's data-parallel buffer layout: for the simulator, and for the SCAPE adapter.

Megatron's DDP (with the distributed optimizer) puts every trainable param in one contiguous
buffer per (param dtype, grad dtype): params in reverse order, each start aligned to 64
elements, each bucket padded to a multiple of lcm(W, 128). Bucket b splits into W equal
shards, rank r owns the r-th. :func:`flat_layout` turns that into a
:class:`scape.layout.FlatLayout`, so the simulator can run on *exactly* Megatron's layout
(same shards, same padding, same k per shard) and the two can be compared bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scape.layout import FlatLayout

__all__ = ["BucketShard", "bucket_shards", "flat_layout", "single_buffer"]


def single_buffer(ddp):
    """The one param-and-grad buffer SCAPE supports (dense params of one dtype, no experts)."""
    if len(ddp.buffers) != 1 or ddp.expert_parallel_buffers:
        raise ValueError(
            "SCAPE supports one data-parallel buffer (all trainable params of one dtype, no "
            f"expert-parallel params); this model has {len(ddp.buffers)} dense and "
            f"{len(ddp.expert_parallel_buffers)} expert buffers"
        )
    return ddp.buffers[0]


@dataclass(frozen=True)
class BucketShard:
    """Bucket ``index`` covers ``[start, end)`` of the flat buffer; shards have ``size`` entries."""

    index: int
    start: int
    end: int
    size: int

    def shard_range(self, rank: int) -> tuple[int, int]:
        """Flat-buffer range of ``rank``'s shard of this bucket."""
        return self.start + rank * self.size, self.start + (rank + 1) * self.size


def bucket_shards(ddp) -> list[BucketShard]:
    buffer = single_buffer(ddp)
    world = buffer.data_parallel_world_size
    out = []
    for i, bucket in enumerate(buffer.buckets):
        n = bucket.grad_data.numel()
        if n % world:
            raise ValueError(f"bucket {i} has {n} entries, not divisible by W={world}")
        out.append(BucketShard(i, bucket.offset, bucket.offset + n, n // world))
    return out


def flat_layout(ddp, world_size: int | None = None) -> FlatLayout:
    """Megatron's layout as a FlatLayout; params in ``ddp.module.parameters()`` order.

    ``world_size``: the layout W ranks would have, read off a DDP built in a smaller group
    (the simulator's one process). Megatron pads each bucket to a multiple of lcm(dp, 128) and
    aligns params to 64 entries, so the layout is the same for every W that divides 128 (and
    the same bucket size); other W raise ``ValueError``.
    """
    buffer = single_buffer(ddp)
    built = buffer.data_parallel_world_size
    world = built if world_size is None else world_size
    if world != built and math.lcm(world, 128) != math.lcm(built, 128):
        raise ValueError(
            f"Megatron's buffer layout at W={world} differs from the one built at W={built} "
            "(buckets pad to lcm(W, 128)); use a W that divides 128"
        )
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    offsets, numels = [], []
    for p in params:
        start, end, _bucket = buffer.param_index_map[p]
        offsets.append(start)
        numels.append(end - start)
    buckets = tuple((b.offset, b.offset + b.grad_data.numel()) for b in buffer.buckets)
    return FlatLayout(
        param_offsets=tuple(offsets),
        param_numels=tuple(numels),
        buckets=buckets,
        total=buffer.numel,
        world_size=world,
    )
