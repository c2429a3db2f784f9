"""A true ring reduce-scatter over point-to-point sends, for gloo.

gloo's ``reduce_scatter_tensor`` sends about twice the ring volume (it behaves like an
all-reduce: measured on the namespaces' interface counters, see the calibration in
results/bench/cluster.json), while NCCL, which the paper's cluster uses, runs a ring with
(W-1)/W of the input per rank. So the emulated cluster reduces with this ring by default,
for dense and SCAPE alike; ``native`` keeps gloo's own collective for comparison.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from scape.comm import GRAD_VALUES, SparseCommunicator

__all__ = ["RingCommunicator", "ring_reduce_scatter"]


def ring_reduce_scatter(out: Tensor, inp: Tensor, group: dist.ProcessGroup | None = None) -> None:
    """Sum-reduce ``inp`` (W*c,) over the group; rank r gets chunk r in ``out`` (c,).

    W-1 steps; at step s rank r passes its running sum of chunk (r-s-1) to rank r+1 and
    adds its own copy of chunk (r-s-2) to what arrives from rank r-1. After W-1 steps the
    sum that lands on rank r is chunk r with every rank's contribution.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = inp.view(world, -1)
    if world == 1:
        out.copy_(chunks[0])
        return
    nxt = dist.get_global_rank(group, (rank + 1) % world) if group else (rank + 1) % world
    prv = dist.get_global_rank(group, (rank - 1) % world) if group else (rank - 1) % world
    acc = chunks[(rank - 1) % world].clone()
    buf = acc.new_empty(acc.shape)
    for s in range(world - 1):
        reqs = [dist.isend(acc, nxt, group=group), dist.irecv(buf, prv, group=group)]
        for req in reqs:
            req.wait()
        acc = buf + chunks[(rank - s - 2) % world]
    out.copy_(acc)


class RingCommunicator(SparseCommunicator):
    """``SparseCommunicator`` whose reduce-scatter is :func:`ring_reduce_scatter` (synchronous)."""

    def reduce_scatter(self, packed: Tensor, *, kind: str = GRAD_VALUES, async_op: bool = False):
        if async_op:
            raise ValueError("the p2p ring reduce-scatter is synchronous")
        if packed.numel() % self.world_size:
            raise ValueError(
                f"packed length {packed.numel()} is not a multiple of W={self.world_size}"
            )
        out = packed.new_empty(packed.numel() // self.world_size)
        self._count(kind, packed)
        ring_reduce_scatter(out, packed, self.group)
        return out, None
