"""Where each parameter lives in the flat data-parallel buffer, and how that is bucketed.

Megatron's distributed optimizer lays params out in reverse order, aligns starts to 64
elements and pads buckets to a multiple of lcm(W, 128); the simulator can take exactly
that layout (see ``scape.megatron``) or build a plain contiguous one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FlatLayout"]


@dataclass(frozen=True)
class FlatLayout:
    """param_offsets[i] is the start of parameter i (model.parameters() order).

    buckets are (start, end) ranges covering [0, total); each length divides by world_size,
    so a bucket splits into W equal contiguous shards, shard r owned by rank r.
    """

    param_offsets: tuple[int, ...]
    param_numels: tuple[int, ...]
    buckets: tuple[tuple[int, int], ...]
    total: int
    world_size: int

    def __post_init__(self) -> None:
        if len(self.param_offsets) != len(self.param_numels):
            raise ValueError("param_offsets and param_numels differ in length")
        pos = 0
        for start, end in self.buckets:
            if start != pos or end <= start:
                raise ValueError(f"buckets must tile [0, total) in order; got {self.buckets}")
            if (end - start) % self.world_size:
                raise ValueError(f"bucket ({start}, {end}) is not divisible by W={self.world_size}")
            pos = end
        if pos != self.total:
            raise ValueError(f"buckets end at {pos}, total is {self.total}")
        for off, n in zip(self.param_offsets, self.param_numels, strict=True):
            if off < 0 or off + n > self.total:
                raise ValueError(
                    f"param range ({off}, {off + n}) is outside the buffer of {self.total}"
                )

    @classmethod
    def contiguous(
        cls, numels: Sequence[int], world_size: int, *, bucket_size: int | None = None
    ) -> FlatLayout:
        """Params back to back in order; buckets of about ``bucket_size`` elements (one if None),
        each padded up to a multiple of W. A bucket only closes at a param boundary."""
        offsets, pos, buckets, bucket_start = [], 0, [], 0

        def close(end: int) -> int:
            padded = bucket_start + math.ceil((end - bucket_start) / world_size) * world_size
            buckets.append((bucket_start, padded))
            return padded

        for n in numels:
            offsets.append(pos)
            pos += n
            if bucket_size is not None and pos - bucket_start >= bucket_size:
                pos = close(pos)
                bucket_start = pos
        if pos > bucket_start or not buckets:
            pos = close(max(pos, bucket_start + world_size))
        return cls(tuple(offsets), tuple(numels), tuple(buckets), pos, world_size)

    def shard_size(self, bucket: int) -> int:
        start, end = self.buckets[bucket]
        return (end - start) // self.world_size
