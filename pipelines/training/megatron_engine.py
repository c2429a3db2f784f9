"""The Megatron-Core training engine of one rank: model, DDP, optimizer, and their state.

Dense AdamW / AdamS through Megatron's DistributedOptimizer, or SCAPE through its subclasses
(``scape.megatron``). Each optimizer saves itself: SCAPE through Megatron's distributed
checkpointing, the dense ZeRO-1 shards per rank. Built by
:func:`pipelines.training.engine.build_engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipelines.training.config import PretrainConfig
from pipelines.training.engine_base import EngineCommon

__all__ = ["MegatronEngine"]


@dataclass
class MegatronEngine(EngineCommon):
    """Any optimizer built by :mod:`scape.megatron` (dense or SCAPE) answers the same calls:
    ``sent_bytes``, ``check_consistency``, ``save_checkpoint`` / ``load_checkpoint``."""

    cfg: PretrainConfig
    ddp: Any
    optimizer: Any
    data_dir: Path
    device: torch.device
    _bytes_seen: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ training
    def step(self, micro_batches):
        from scape.megatron.train import train_step

        return train_step(self.ddp, self.optimizer, micro_batches)

    def bytes_last_step(self) -> dict[str, float]:
        """Bytes this rank sent in the last step, by kind of traffic (ring accounting)."""
        return self._bytes_since_last(self.optimizer.sent_bytes())

    def check_consistency(self, step: int) -> None:
        del step  # the optimizer names the step it is at
        self.optimizer.check_consistency()

    def sync_params(self) -> None:
        from scape.megatron.train import sync_params

        sync_params(self.ddp)

    # ------------------------------------------------------------------ state
    def save_optimizer(self, directory: Path) -> dict[str, Any]:
        """The optimizer's own checkpoint: SCAPE through Megatron's distributed checkpointing,
        dense ZeRO-1 shards in the rank file."""
        return self.optimizer.save_checkpoint(directory)

    def load_optimizer(self, directory: Path, rank_part: dict[str, Any]) -> None:
        self.optimizer.load_checkpoint(directory, rank_part)
