"""The communicator over real gloo groups: the same sums and byte counts as the simulator's."""

import pytest
import torch
import torch.distributed as dist

from scape.basis import ShardBasis
from scape.comm import SparseCommunicator, ring_bytes_per_rank, step_bytes_per_rank
from scape.shard import pack
from scape.spawn import run_distributed

SHARD, CHUNK, K = 1000, 100, 2


def rank_candidate(rank, world_size):
    return torch.randn(world_size * SHARD, generator=torch.Generator().manual_seed(100 + rank))


def owner_masks(world_size):
    """Each shard's mask, as its owner would make it (the same on every rank)."""
    basis = ShardBasis(SHARD, CHUNK, K)
    gen = torch.Generator().manual_seed(7)
    return basis, torch.stack(
        [basis.select(torch.randn(SHARD, generator=gen)) for _ in range(world_size)]
    )


def _exchange(rank, world_size):
    comm = SparseCommunicator()
    basis, masks = owner_masks(world_size)
    wire = pack(basis, rank_candidate(rank, world_size), masks, world_size=world_size,
                value_dtype="float32")  # fmt: skip
    summed, _ = comm.all_reduce_values(wire.clone())
    # The owner sends its own mask (one byte per offset); everyone receives everyone's.
    gathered, work = comm.all_gather_masks(masks[rank].to(torch.uint8))
    work.wait()
    return summed, gathered.view(world_size, -1).long(), comm.counter.snapshot(), dist.get_backend()


@pytest.mark.parametrize("world_size", [2, 4])
def test_one_all_reduce_and_the_mask_all_gather_match_single_process_sums(world_size):
    results = run_distributed(_exchange, world_size, timeout_s=120)
    basis, masks = owner_masks(world_size)
    wires = [
        pack(
            basis,
            rank_candidate(r, world_size),
            masks,
            world_size=world_size,
            value_dtype="float32",
        )
        for r in range(world_size)
    ]
    expected = wires[0]
    for w in wires[1:]:
        expected = expected + w  # the simulator's sum, in rank order
    n = world_size * basis.num_selected
    ring = (world_size - 1) / world_size
    for summed, gathered, counts, backend in results:
        assert backend == "gloo"
        if world_size == 2:
            assert torch.equal(summed, expected)  # a + b is exact whichever rank adds
        else:  # gloo may add 4 terms in another order than rank order: rounding only
            torch.testing.assert_close(summed, expected, rtol=1e-6, atol=1e-6)
        assert torch.equal(gathered, masks)
        assert counts["grad_values"] == counts["param_values"] == ring * n * 4
        assert counts["grad_values"] == ring_bytes_per_rank(n * 4, world_size)
        assert counts["masks"] == ring * n  # one byte per selected coefficient


def test_step_bytes_are_one_all_reduce_per_bucket_plus_one_byte_per_mask_entry():
    """The formula the simulator, the benchmarks' tables and the projection share."""
    ring = 3 / 4
    sparse = step_bytes_per_rank([10, 3], 4, 2, masks=True)
    assert sparse["grad_values"] == sparse["param_values"] == ring * (4 * 10 + 1 + 4 * 3 + 1) * 2
    assert sparse["masks"] == ring * 4 * 13 and sparse["scalars"] == 0.0
    dense = step_bytes_per_rank([1000], 4, 4, masks=False)
    assert dense["grad_values"] == ring * (4 * 1000 + 1) * 4 and dense["masks"] == 0.0
    assert step_bytes_per_rank([10], 1, 4, masks=True)["grad_values"] == 0.0  # no peers
