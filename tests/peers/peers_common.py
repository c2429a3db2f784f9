"""Helpers shared by the peer-baseline tests, and their one distributed run (importable by spawned ranks)."""

from __future__ import annotations

import hashlib
import io

import torch
from torch import Tensor


class FakeBucket:
    """Stands in for ``dist.GradBucket`` outside DDP: ``grads`` laid out flat in order."""

    def __init__(self, index: int, params: list[Tensor], grads: list[Tensor], *, last: bool = True):
        self._index, self._params, self._last = index, list(params), last
        self._buffer = torch.cat([g.reshape(-1).float() for g in grads])

    def index(self) -> int:
        return self._index

    def buffer(self) -> Tensor:
        return self._buffer

    def parameters(self) -> list[Tensor]:
        return self._params

    def gradients(self) -> list[Tensor]:
        out, offset = [], 0
        for p in self._params:
            out.append(self._buffer[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return out

    def is_last(self) -> bool:
        return self._last


def split(flat: Tensor, params: list[Tensor]) -> list[Tensor]:
    """A bucket-ordered flat tensor back into per-parameter tensors."""
    out, offset = [], 0
    for p in params:
        out.append(flat[offset : offset + p.numel()].view_as(p).clone())
        offset += p.numel()
    return out


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights_only_round_trip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as
    pipelines/training/checkpoint.py loads."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# Test modules whose `_suite(rank, world_size, group)` runs in the one shared gloo run.
SUITES = ("test_peers_dgc", "test_peers_onebit", "test_peers_powersgd")


def run_suites(rank: int, world_size: int) -> dict:
    """Everything distributed, in one spawned 3-rank run (spawning and importing torch, and
    the torch._dynamo import of a process's first DDP, ~6 s a rank here, are the cost):
    the 3-rank 1-bit all-reduce on all ranks, then every module's suite on ranks 0 and 1
    over a sub-group, which also exercises the hooks' ``process_group`` argument."""
    import importlib

    import torch.distributed as dist

    onebit = importlib.import_module("test_peers_onebit")
    out = {"allreduce3": onebit._allreduce_runs(rank, world_size)}
    pair = dist.new_group([0, 1])  # collective: every rank creates it
    if rank < 2:
        for name in SUITES:
            out[name] = importlib.import_module(name)._suite(rank, 2, pair)
    dist.barrier()  # rank 2 stays until the pair is done
    return out
