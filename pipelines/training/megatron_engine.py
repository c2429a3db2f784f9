"""The Megatron-Core training engine of one rank: model, DDP, optimizer, and their state.

Dense AdamW / AdamS through Megatron's DistributedOptimizer, or SCAPE through its subclasses
(``scape.megatron``). Checkpoint state is per rank (ZeRO-style optimizer shards). Built by
:func:`pipelines.training.engine.build_engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipelines.training.config import PretrainConfig
from pipelines.training.engine_base import EngineCommon, check_replicas
from scape.comm import GRAD_VALUES, PARAM_VALUES, ring_bytes_per_rank

__all__ = ["MegatronEngine"]


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


@dataclass
class MegatronEngine(EngineCommon):
    cfg: PretrainConfig
    ddp: Any
    optimizer: Any
    data_dir: Path
    device: torch.device
    _bytes_seen: dict[str, float] = field(default_factory=dict)

    @property
    def is_scape(self) -> bool:
        return self.cfg.optimizer.name == "scape"

    # ------------------------------------------------------------------ training
    def step(self, micro_batches):
        from scape.megatron.train import train_step

        return train_step(self.ddp, self.optimizer, micro_batches)

    def bytes_last_step(self) -> dict[str, float]:
        """Bytes this rank sent in the last step, by kind of traffic (ring accounting)."""
        if self.is_scape:
            return self._counter_delta(self.optimizer.scape.comm.counter)
        # Dense ZeRO-1: one reduce-scatter of the grad buffer, one all-gather of the params.
        world = dist.get_world_size()
        grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in self.ddp.buffers)
        params = sum(b.param_data.numel() * b.param_data.element_size() for b in self.ddp.buffers)
        return {
            GRAD_VALUES: ring_bytes_per_rank(grads, world),
            PARAM_VALUES: ring_bytes_per_rank(params, world),
        }

    def check_consistency(self, step: int) -> None:
        if self.is_scape:
            self.optimizer.check_consistency()
            return
        self.sync_params()
        bits = torch.cat(
            [
                b.param_data.view(torch.int32 if b.param_data.element_size() == 4 else torch.int16)
                .to(torch.int64)
                .sum()
                .view(1)
                for b in self.ddp.buffers
            ]
        )
        check_replicas(bits, "dense", step)

    def sync_params(self) -> None:
        from scape.megatron.train import sync_params

        sync_params(self.ddp)

    # ------------------------------------------------------------------ state
    def optimizer_state(self) -> dict[str, Any]:
        if self.is_scape:
            from scape.megatron.checkpoint import scape_state_dict

            return {"scape": scape_state_dict(self.optimizer)}
        shards = []
        for opt in _inner_optimizers(self.optimizer):
            inner = opt.optimizer
            mains = [p.detach().cpu().clone() for g in inner.param_groups for p in g["params"]]
            shards.append({"inner": inner.state_dict(), "main_params": mains})
        return {"dense": shards}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.is_scape:
            from scape.megatron.checkpoint import load_scape_state_dict

            load_scape_state_dict(self.optimizer, state["scape"])
            return
        for opt, shard in zip(_inner_optimizers(self.optimizer), state["dense"], strict=True):
            inner = opt.optimizer
            inner.load_state_dict(shard["inner"])
            mains = [p for g in inner.param_groups for p in g["params"]]
            with torch.no_grad():
                for p, saved in zip(mains, shard["main_params"], strict=True):
                    p.copy_(saved)
            opt._copy_main_params_to_model_params()
