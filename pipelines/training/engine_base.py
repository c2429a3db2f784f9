"""What every training engine of one rank shares: the model's state, export, lr, byte deltas,
and the cross-rank replica check.

:mod:`pipelines.training.megatron_engine` (dense and SCAPE through Megatron's optimizers) and
:mod:`pipelines.training.peer_engine` (the peer baselines) both build on :class:`EngineCommon`;
:func:`pipelines.training.engine.build_engine` picks one.
"""

from __future__ import annotations

from pathlib import Path

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

    Expects ``cfg``, ``ddp`` (whose ``module`` is the GPTModel), ``optimizer``, ``data_dir``
    and ``_bytes_seen`` on the instance.
    """

    def current_lr(self) -> float:
        groups = self.optimizer.param_groups
        return float(max(g["lr"] / g.get("lr_mult", 1.0) for g in groups))

    def _counter_delta(self, counter) -> dict[str, float]:
        """Bytes a ``ByteCounter`` gained since the last call."""
        now = counter.snapshot()
        delta = {k: v - self._bytes_seen.get(k, 0.0) for k, v in now.items()}
        self._bytes_seen = now
        return delta

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        return {
            k: v.detach().cpu().clone()
            for k, v in self.ddp.module.state_dict().items()
            if v is not None
        }

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.ddp.module.load_state_dict(state, strict=False)

    def export(self, out_dir: Path, step: int) -> None:
        """Rank 0 only, after every rank has called :meth:`sync_params` (a collective)."""
        from eval.export import export_model

        export_model(self.ddp.module, self.cfg.model, self.data_dir, out_dir, step=step)
