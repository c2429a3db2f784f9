"""The p2p ring reduce-scatter sums exactly what gloo's own collective sums."""

import torch
import torch.distributed as dist

from benchmarks.ring import ring_reduce_scatter
from scape.testing import run_distributed


def _compare(rank: int, world: int) -> bool:
    g = torch.Generator().manual_seed(rank)
    inp = torch.randint(-1000, 1000, (world * 5,), generator=g).float()  # exact integer sums
    ours, theirs = torch.empty(5), torch.empty(5)
    ring_reduce_scatter(ours, inp)
    dist.reduce_scatter_tensor(theirs, inp)
    return torch.equal(ours, theirs)


def test_ring_matches_gloo_on_three_ranks():
    assert run_distributed(_compare, 3) == [True, True, True]
