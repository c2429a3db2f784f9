"""What every training engine of one rank shares: the model's state, export, lr, byte deltas,
and the cross-rank replica check.

:mod:`pipelines.training.megatron_engine` (dense and SCAPE through Megatron's optimizers),
:mod:`pipelines.training.peer_engine` (the peer baselines) and
:mod:`pipelines.training.simulator_engine` (W workers in one process) build on
:class:`EngineCommon`; :func:`pipelines.training.engine.build_engine` picks one by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["EngineCommon", "check_replicas"]


def check_replicas(checksum: torch.Tensor, what: str, step: int) -> None:
    """All-gather this rank's parameter checksum; raise if any rank's differs."""
    from scape.megatron.optimizer import ReplicaDivergence

    everyone = [torch.zeros_like(checksum) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, checksum)
    if any(not torch.equal(e, everyone[0]) for e in everyone):
        raise ReplicaDivergence(
            f"{what} replicas diverged at step {step}: {[e.tolist() for e in everyone]}"
        )


class EngineCommon:
    """What every engine does the same way: the model's state, export, lr, byte deltas.

    Expects ``cfg``, ``optimizer``, ``data_dir`` and ``_bytes_seen`` on the instance, and
    ``ddp`` (whose ``module`` is the GPTModel) unless :attr:`module` and :attr:`runner` are
    overridden.
    """

    @property
    def module(self):
        """The GPTModel (what is saved and exported)."""
        return self.ddp.module

    @property
    def runner(self):
        """What a forward pass goes through (the DDP wrapper, where there is one)."""
        return self.ddp

    def data_ranks(self, rank: int) -> list[int]:
        """The data-parallel ranks whose batches this process trains on: its own."""
        return [rank]

    def step_on(self, data, step: int, rank: int, micro_batch_size: int):
        """One training step on this process's batches of ``data`` (a ``TrainingData``)."""
        return self.step(data.rank_micro_batches(step, rank, micro_batch_size))

    def current_lr(self) -> float:
        groups = self.optimizer.param_groups
        return float(max(g["lr"] / g.get("lr_mult", 1.0) for g in groups))

    def _bytes_since_last(self, now: dict[str, float]) -> dict[str, float]:
        """What a running byte total (by kind) gained since the last call."""
        delta = {k: v - self._bytes_seen.get(k, 0.0) for k, v in now.items()}
        self._bytes_seen = now
        return delta

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        return {
            k: v.detach().cpu().clone()
            for k, v in self.module.state_dict().items()
            if v is not None
        }

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state, strict=False)

    def save_optimizer(self, directory: Path) -> dict[str, Any]:
        """Collective. Save what the optimizer shards under ``directory``; return the rest of
        this rank's optimizer state (for its rank file)."""
        del directory  # nothing sharded: the whole state goes in the rank file
        return self.optimizer_state()

    def load_optimizer(self, directory: Path, rank_part: dict[str, Any]) -> None:
        """Collective. Restore :meth:`save_optimizer`'s ``directory`` and ``rank_part``."""
        del directory
        self.load_optimizer_state(rank_part)

    def export(self, out_dir: Path, step: int) -> None:
        """Rank 0 only, after every rank has called :meth:`sync_params` (a collective)."""
        from eval.export import export_model

        export_model(self.module, self.cfg.model, self.data_dir, out_dir, step=step)
