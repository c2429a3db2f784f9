"""Megatron's dense ZeRO-1 optimizer with what a training engine asks of every optimizer here.

:func:`scape.megatron.dense.build_dense_optimizer` lets Megatron's stock factory build its
``ChainedOptimizer`` of ``DistributedOptimizer`` s, then re-classes that very object to
:class:`DenseOptimizer` (as the SCAPE adapter re-classes its optimizer and bucket groups): the
subclass adds methods and one counter, so whatever the release's constructor set up stays.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core.optimizer import ChainedOptimizer

from scape.comm import GRAD_VALUES, PARAM_VALUES, ring_bytes_per_rank
from scape.megatron.replicas import ReplicaDivergence

__all__ = ["DenseOptimizer"]


class DenseOptimizer(ChainedOptimizer):
    """Megatron's ChainedOptimizer of DistributedOptimizers (ZeRO-1), re-classed after the
    stock factory built it, with what a training engine asks of any optimizer here (the
    same methods as :class:`scape.megatron.optimizer.ScapeDistributedOptimizer`): bytes
    sent, a cross-rank replica check, and this rank's state for per-rank checkpoints."""

    ddp: Any
    steps_taken: int

    def step(self):
        self.steps_taken += 1
        return super().step()

    def sent_bytes(self) -> dict[str, float]:
        """Bytes this rank has sent, by kind: one reduce-scatter of the grad buffer and one
        all-gather of the params per step (ring accounting)."""
        world = dist.get_world_size()
        grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in self.ddp.buffers)
        params = sum(b.param_data.numel() * b.param_data.element_size()
                     for b in self.ddp.buffers)  # fmt: skip
        return {GRAD_VALUES: self.steps_taken * ring_bytes_per_rank(grads, world),
                PARAM_VALUES: self.steps_taken * ring_bytes_per_rank(params, world)}  # fmt: skip

    @torch.no_grad()
    def check_consistency(self) -> None:
        """Every rank's params hold the same bits (after the pending all-gather)."""
        from scape.megatron.train import sync_params

        sync_params(self.ddp)
        local = torch.cat([
            b.param_data.view(torch.int32 if b.param_data.element_size() == 4 else torch.int16)
            .to(torch.int64).sum().view(1) for b in self.ddp.buffers
        ])  # fmt: skip
        everyone = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, local)
        if any(not torch.equal(e, everyone[0]) for e in everyone):
            raise ReplicaDivergence(f"dense replicas diverged at step {self.steps_taken}: "
                                    f"{[e.tolist() for e in everyone]}")  # fmt: skip

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's shards: each inner optimizer's state and its fp32 main params."""
        shards = []
        for opt in self.chained_optimizers:
            inner = opt.optimizer
            mains = [p.detach().cpu().clone() for g in inner.param_groups for p in g["params"]]
            shards.append({"inner": inner.state_dict(), "main_params": mains})
        return {"dense": shards, "steps_taken": self.steps_taken}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        for opt, shard in zip(self.chained_optimizers, state["dense"], strict=True):
            inner = opt.optimizer
            inner.load_state_dict(shard["inner"])
            mains = [p for g in inner.param_groups for p in g["params"]]
            with torch.no_grad():
                for p, saved in zip(mains, shard["main_params"], strict=True):
                    p.copy_(saved)
            opt._copy_main_params_to_model_params()
        self.steps_taken = int(state.get("steps_taken", 0))

    def save_checkpoint(self, directory) -> dict[str, Any]:
        """For a trainer's checkpoint: the ZeRO-1 shards go in the rank's own file (returned);
        nothing is written under ``directory``."""
        del directory
        return self.rank_state_dict()

    def load_checkpoint(self, directory, rank_part: dict[str, Any]) -> None:
        del directory
        self.load_rank_state_dict(rank_part)
