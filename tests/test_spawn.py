"""The spawned-rank harness: results in rank order, failures surface with the rank's traceback."""

import pytest
import torch
import torch.distributed as dist

from scape.spawn import DistributedRunError, run_distributed


def _all_reduce_rank(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(f"hello from {rank}")
    return rank, float(t.item())


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()


def test_results_come_back_in_rank_order():
    out = run_distributed(_all_reduce_rank, 3)
    assert out == [(0, 3.0), (1, 3.0), (2, 3.0)]


def test_failure_names_rank_and_error():
    with pytest.raises(DistributedRunError, match=r"rank 1 failed(.|\n)*boom on purpose"):
        run_distributed(_fail_on_rank_one, 2, timeout_s=20)
