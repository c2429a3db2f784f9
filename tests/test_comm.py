"""The communicator over real gloo groups: same values and byte counts as the simulator's sums."""

import pytest
import torch
import torch.distributed as dist

from scape.comm import SparseCommunicator, bucket_positions, ring_bytes_per_rank
from scape.encoding import decode_mask, encode_mask, encoded_nbytes
from scape.masks import num_selected, select_topk
from scape.shard import pack_values
from scape.testing import run_distributed

SHARD, DENSITY = 1000, 0.05


def rank_buffers(rank, world_size):
    gen = torch.Generator().manual_seed(100 + rank)
    n = world_size * SHARD
    return torch.randn(n, generator=gen), torch.randn(n, generator=gen)  # residual, grad


def shared_masks(world_size):
    gen = torch.Generator().manual_seed(7)
    k = num_selected(SHARD, DENSITY)
    return [select_topk(torch.rand(SHARD, generator=gen), k) for _ in range(world_size)]


def _exchange(rank, world_size):
    return {enc: _exchange_once(rank, world_size, enc) for enc in ("int32", "offset16", "bitmap")}


def _exchange_once(rank, world_size, encoding):
    comm = SparseCommunicator()
    residual, grad = rank_buffers(rank, world_size)
    masks = shared_masks(world_size)
    wire = pack_values(
        residual, grad, bucket_positions(masks, SHARD), world_size=world_size, value_dtype="float32"
    )
    reduced, _ = comm.reduce_scatter(wire)
    gathered, _ = comm.all_gather(reduced * 2)
    # The owner encodes its own mask; everyone decodes everyone's.
    payload = encode_mask(masks[rank], SHARD, encoding)
    all_payloads, work = comm.all_gather_masks(payload)
    work.wait()
    n = payload.numel()
    decoded = [
        decode_mask(all_payloads[j * n : (j + 1) * n], SHARD, masks[j].numel(), encoding)
        for j in range(world_size)
    ]
    return reduced, gathered, decoded, comm.counter.snapshot(), dist.get_backend()


@pytest.mark.parametrize("world_size", [2, 4])
def test_sparse_exchange_matches_single_process_sums(world_size):
    per_rank = run_distributed(_exchange, world_size, timeout_s=120)
    for encoding in ("int32", "offset16", "bitmap"):
        _check(world_size, encoding, [r[encoding] for r in per_rank])


def _check(world_size, encoding, results):
    masks = shared_masks(world_size)
    positions = bucket_positions(masks, SHARD)
    wires = [
        pack_values(
            *rank_buffers(r, world_size), positions, world_size=world_size, value_dtype="float32"
        )
        for r in range(world_size)
    ]
    expected = wires[0]
    for w in wires[1:]:
        expected = expected + w
    k = masks[0].numel()
    for rank, (reduced, gathered, decoded, counts, backend) in enumerate(results):
        assert backend == "gloo"
        chunk = expected[rank * k : (rank + 1) * k]
        if world_size == 2:
            assert torch.equal(reduced, chunk)  # a + b is exact whichever rank adds
        else:
            # gloo may add 4 terms in another order than rank order: float rounding only.
            torch.testing.assert_close(reduced, chunk, rtol=1e-6, atol=1e-6)
        assert torch.equal(gathered, torch.cat([r[0] * 2 for r in results]))
        assert all(torch.equal(a, b) for a, b in zip(decoded, masks, strict=True))
        ring = (world_size - 1) / world_size
        assert (
            counts["grad_values"]
            == ring * world_size * k * 4
            == ring_bytes_per_rank(world_size * k * 4, world_size)
        )
        assert counts["param_values"] == ring * world_size * k * 4
        assert counts["masks"] == ring * world_size * encoded_nbytes(SHARD, k, encoding)
