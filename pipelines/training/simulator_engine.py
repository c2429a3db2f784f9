"""The simulator engine: W data-parallel workers in one process, behind the engine interface.

The quality studies train with :class:`scape.simulate.Simulator` for speed (no processes, no
collectives; the all-reduce is a sum in rank order). This engine puts that simulator behind
the same calls as :class:`~pipelines.training.megatron_engine.MegatronEngine`, so the
pretrain loop (schedule, clipping, evaluation, metrics, checkpoints) drives either, and a
run of one setting through both engines can be compared step by step
(``tests/pipelines/training/test_two_engines.py``).

What makes the two engines train the same model:

- the same Megatron GPTModel, built after the same seeding (:func:`scape.megatron.dense.init_megatron`);
- SCAPE on Megatron's own buffer layout (same buckets, shards, padding and k per shard),
  read off a Megatron DDP over a twin of the model (:func:`scape.megatron.layout.flat_layout`);
- each worker's gradient built micro-batch by micro-batch, as Megatron's ``train_step``
  accumulates it (:func:`_micro_batch_loss`);
- Megatron's weight-decay groups (:func:`scape.simulate.default_decay_filter`) and clipping rule;
- the lr (and constant weight decay) of the same Megatron scheduler, which drives the
  param groups of :class:`ScheduledGroups` here.

The simulator keeps fp32 params; bf16 and the peer baselines run on the Megatron engine only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from pipelines.training.config import PretrainConfig, scape_config
from pipelines.training.engine_base import EngineCommon

__all__ = ["ScheduledGroups", "SimulatorEngine", "build_simulator_engine", "megatron_layout"]

Batch = tuple[Tensor, Tensor]


class ScheduledGroups:
    """What Megatron's ``OptimizerParamScheduler`` drives: one param group's lr and weight
    decay (the simulator steps every entry with one lr; decay follows its own groups)."""

    def __init__(self, lr: float, weight_decay: float) -> None:
        self.param_groups = [{"lr": lr, "weight_decay": weight_decay, "wd_mult": 1.0,
                              "lr_mult": 1.0}]  # fmt: skip


def _micro_batch_loss(model: nn.Module, micro_batches: list[Batch]) -> Tensor:
    """One worker's micro-batches as Megatron's ``train_step`` runs them: a backward per
    micro-batch, each fp32 loss over n, so the gradient builds up in the same order.

    The simulator calls ``backward`` on what this returns, so every micro-batch but the last
    is backpropagated here and enters the sum detached; ``.grad`` then holds
    ``(g_1 + g_2) + ... + g_n`` as Megatron's ``main_grad`` does. One backward over the summed
    losses would add the tied embedding's contributions (input lookup and output layer, from
    every micro-batch) in autograd's order instead, which differs in the last bits: enough to
    tip a bf16 value on the wire (the shipped ramp's engines parted at step 2) or any fp32 one.
    The terms are summed in float64 (``train_step`` sums ``.item()`` s): the same loss bits."""
    from scape.megatron.train import forward_loss

    device = next(model.parameters()).device
    n = len(micro_batches)
    terms = []
    for i, (tokens, labels) in enumerate(micro_batches):
        term = forward_loss(model, tokens.to(device), labels.to(device)) / n
        if i < n - 1:  # Megatron's no_sync micro-batches: backward now, accumulate in .grad
            term.backward()
            term = term.detach()
        terms.append(term.double())
    return sum(terms[1:], terms[0])


@dataclass
class SimulatorEngine(EngineCommon):
    """W simulated workers in this one process (the process group has one rank)."""

    cfg: PretrainConfig | None  # None: a study's engine (:meth:`around`), which cannot export
    model: nn.Module
    simulator: Any  # scape.simulate.Simulator
    optimizer: ScheduledGroups
    data_dir: Path | None
    device: torch.device
    sent: dict[str, float] = field(default_factory=dict)  # the last step's bytes by kind

    @classmethod
    def around(cls, simulator: Any) -> SimulatorEngine:
        """An engine over a simulator built elsewhere: the quality studies' (a library
        method's on the study's layout, or a reading's). It trains, evaluates and saves as
        any engine does; without a pretrain config it does not export."""
        device = next(simulator.model.parameters()).device
        groups = ScheduledGroups(simulator.hp.lr, simulator.hp.weight_decay)
        return cls(None, simulator.model, simulator, groups, None, device)

    def data_ranks(self, rank: int) -> list[int]:
        """Every worker's data: this process is all of them."""
        del rank
        return list(range(self.simulator.world_size))

    # ------------------------------------------------------------------ training
    def step_on(self, data, step: int, rank: int, micro_batch_size: int):
        return self.step([data.rank_micro_batches(step, w, micro_batch_size)
                          for w in self.data_ranks(rank)])  # fmt: skip

    def step(self, micro_batches: list[list[Batch]]):
        """One step of every worker; ``micro_batches[w]`` is worker w's."""
        from scape.megatron.train import StepResult

        start = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        result = self.simulator.step(micro_batches, _micro_batch_loss, lr=lr)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.sent = dict(result.bytes)
        diagnostics = {k: getattr(result, k) for k in ("mask_overlap", "moment_norm")
                       if getattr(result, k) is not None}  # fmt: skip
        return StepResult(result.loss, result.grad_norm, not result.skipped,
                          time.perf_counter() - start, diagnostics)  # fmt: skip

    def bytes_last_step(self) -> dict[str, float]:
        """Bytes one rank would send (ring accounting), by kind of traffic."""
        return dict(self.sent)

    def check_consistency(self, step: int) -> None:
        """One model holds every replica: nothing can diverge."""

    def sync_params(self) -> None:
        """The params are the one model's: nothing in flight."""

    # ------------------------------------------------------------------ state
    @property
    def module(self) -> nn.Module:
        return self.model

    @property
    def runner(self) -> nn.Module:
        return self.model

    def optimizer_state(self) -> dict[str, Any]:
        from scape.simulate import simulator_state

        return {"simulator": simulator_state(self.simulator)}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        from scape.simulate import load_simulator_state

        load_simulator_state(self.simulator, state["simulator"])


def megatron_layout(shape, world_size: int, device: torch.device, *,
                    bucket_size: int | None = None, overlap_grad_reduce: bool = True,
                    overlap_param_gather: bool = False):  # fmt: skip
    """The flat layout W Megatron ranks would build: a DDP over a twin of the model in this
    one-rank group, with the bucket size Megatron would pick at W. Building the twin draws no
    number from the torch RNG the run goes on with."""
    from scape.megatron.dense import wrap_ddp
    from scape.megatron.layout import flat_layout
    from scape.megatron.models import build_gpt_model

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        config, twin = build_gpt_model(shape, device=device)
    # Megatron's default at W ranks (its DDP would pick max(4e7, 1e6 * dp) at dp = 1 here)
    bucket = bucket_size if bucket_size is not None else max(40_000_000, 1_000_000 * world_size)
    ddp = wrap_ddp(config, twin, bucket_size=bucket, overlap_grad_reduce=overlap_grad_reduce,
                   overlap_param_gather=overlap_param_gather)  # fmt: skip
    layout = flat_layout(ddp, world_size)
    del ddp, twin
    return layout


def build_simulator_engine(cfg: PretrainConfig, shape, model: nn.Module, data_dir: Path,
                           device: torch.device) -> SimulatorEngine:  # fmt: skip
    """The simulator over ``model`` (already built after Megatron's seeding) with
    ``cluster.world_size`` workers, AdamW / AdamS / SCAPE as ``optimizer.name`` says."""
    from scape.adams import AdamHParams
    from scape.simulate import Simulator

    o, world = cfg.optimizer, cfg.cluster.world_size
    hparams = AdamHParams(**o.scaled())
    layout = scape = None
    if o.name == "scape":
        scape = scape_config(o, cfg.train.train_steps)
        t = cfg.train
        layout = megatron_layout(shape, world, device, bucket_size=t.bucket_size,
                                 overlap_grad_reduce=t.overlap_grad_reduce,
                                 overlap_param_gather=t.overlap_param_gather)  # fmt: skip
    simulator = Simulator(model, world, method=o.name, hparams=hparams, scape=scape,
                          layout=layout)  # fmt: skip
    groups = ScheduledGroups(hparams.lr, o.weight_decay)
    return SimulatorEngine(cfg, model, simulator, groups, data_dir, device)
