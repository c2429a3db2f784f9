"""The training engine of one rank for the peer baselines (issue 8): PowerSGD, DGC, 1-bit Adam.

Same Megatron-Core model, data, schedule and metrics as
:mod:`pipelines.training.megatron_engine`, but the model is wrapped in PyTorch's
``DistributedDataParallel`` with a communication hook from :mod:`scape.peers` (PowerSGD is
torch's own hook), and every rank holds a full replica of the optimizer: these methods
replace the gradient all-reduce, so they do not combine with Megatron's ZeRO-1
reduce-scatter. The hook counts the bytes it sends, so the metrics carry
bytes per step like the dense and SCAPE runs.

PowerSGD and DGC apply ``optimizer.<method>.local_rule`` (AdamS by default: SCAPE's rule,
so only the communication differs) to the gradient the hook returns; 1-bit Adam brings its
own optimizer. Gradient clipping acts on that exchanged gradient (identical on every rank);
after 1-bit Adam's freeze the exchanged tensor is the momentum, which is not clipped.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pipelines.training.config import PretrainConfig
from pipelines.training.engine_base import EngineCommon, check_replicas
from scape.megatron.train import StepResult

__all__ = ["PeerEngine", "build_peer_engine"]


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Megatron's rule: no weight decay on biases and 1-D (norm) parameters."""
    from scape.simulate import default_decay_filter

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if default_decay_filter(name, p) else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "wd_mult": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "wd_mult": 0.0},
    ]


def _build_hook(cfg: PretrainConfig, params: list[Tensor]):
    from scape.peers import (
        CountedPowerSGD,
        DGCConfig,
        DGCHook,
        OneBitConfig,
        OneBitHook,
        PowerSGDConfig,
    )

    o = cfg.optimizer
    if o.name == "powersgd":
        p = o.powersgd
        conf = PowerSGDConfig(
            rank=p.rank, start_iter=p.start_iter, min_compression_rate=p.min_compression_rate,
            use_error_feedback=p.use_error_feedback, warm_start=p.warm_start, seed=cfg.train.seed,
        )  # fmt: skip
        return CountedPowerSGD(conf, params=params)
    if o.name == "dgc":
        conf = DGCConfig.for_sparsity(
            o.dgc.sparsity, momentum=o.dgc.momentum, value_dtype=o.dgc.value_dtype,
            warmup_steps=o.dgc.warmup_steps, local_clip=o.dgc.local_clip,
            per_tensor=o.dgc.per_tensor,
        )  # fmt: skip
        return DGCHook(conf, params=params)
    return OneBitHook(OneBitConfig(freeze_step=o.onebit.freeze_step, beta1=o.beta1), params=params)


def _build_optimizer(cfg: PretrainConfig, model: torch.nn.Module, hook) -> torch.optim.Optimizer:
    from scape.adams import AdamS
    from scape.peers import OneBitAdam

    o = cfg.optimizer
    groups = _param_groups(model, o.weight_decay)
    kwargs = dict(lr=o.scaled()["lr"], betas=o.betas, eps=o.eps)
    if o.name == "onebit":
        return OneBitAdam(groups, hook, mask_unseen=o.onebit.mask_unseen, **kwargs)
    rule = o.powersgd.local_rule if o.name == "powersgd" else o.dgc.local_rule
    if rule == "adamw":
        return torch.optim.AdamW(groups, foreach=False, **kwargs)
    return AdamS(groups, **kwargs)


@dataclass
class PeerEngine(EngineCommon):
    cfg: PretrainConfig
    ddp: Any  # torch.nn.parallel.DistributedDataParallel over the Megatron GPTModel
    optimizer: torch.optim.Optimizer
    hook: Any  # scape.peers hook state: .counter, .state_dict(), .load_state_dict()
    data_dir: Path
    device: torch.device
    _bytes_seen: dict[str, float] = field(default_factory=dict)

    @property
    def _clips(self) -> bool:
        """Whether the exchanged gradient is clipped: not 1-bit Adam's momentum after its
        freeze, nor DGC's sum of locally clipped gradients (the paper's local clipping)."""
        o = self.cfg.optimizer
        if o.name == "dgc":
            return o.dgc.local_clip == 0
        if o.name != "onebit":
            return True
        return self.hook.step < self.hook.cfg.freeze_step

    # ------------------------------------------------------------------ training
    def step(self, micro_batches: list[tuple[Tensor, Tensor]]) -> StepResult:
        from scape.megatron.train import forward_loss

        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        total, n = 0.0, len(micro_batches)
        for i, (tokens, labels) in enumerate(micro_batches):
            tokens, labels = tokens.to(self.device), labels.to(self.device)
            # The hook (the communication) runs once, in the last micro-batch's backward.
            sync = contextlib.nullcontext() if i == n - 1 else self.ddp.no_sync()
            with sync:
                loss = forward_loss(self.ddp, tokens, labels) / n
                loss.backward()
            total += loss.item()
        params = [p for p in self.ddp.parameters() if p.grad is not None]
        clip = self.cfg.optimizer.clip_grad if self._clips else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf))
        updated = math.isfinite(norm)  # the same on every rank: the hook's result is shared
        if updated:
            self.optimizer.step()
        elif self.cfg.optimizer.name == "onebit":
            self.hook.step += 1  # keep the hook's phase in step with the schedule
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return StepResult(total, norm, updated, time.perf_counter() - start)

    def bytes_last_step(self) -> dict[str, float]:
        return self._bytes_since_last(self.hook.counter.snapshot())

    def check_consistency(self, step: int) -> None:
        """Every rank holds a full replica: their parameters must agree bit for bit."""
        bits = torch.stack(
            [p.detach().view(torch.int32).to(torch.int64).sum() for p in self.ddp.parameters()]
        ).sum()
        check_replicas(bits, self.cfg.optimizer.name, step)

    def sync_params(self) -> None:
        """Parameters are always in sync (replicated optimizer): nothing to gather."""

    # ------------------------------------------------------------------ state
    def optimizer_state(self) -> dict[str, Any]:
        return {"peer": {"optimizer": self.optimizer.state_dict(), "hook": self.hook.state_dict()}}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["peer"]["optimizer"])
        self.hook.load_state_dict(state["peer"]["hook"])


def build_peer_engine(cfg: PretrainConfig, model: torch.nn.Module, data_dir: Path, device):
    """Wrap ``model`` (same seed on every rank) in torch DDP with the method's hook."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        broadcast_buffers=False,
    )
    params = list(ddp.module.parameters())
    hook = _build_hook(cfg, params)
    ddp.register_comm_hook(hook, type(hook).hook)
    optimizer = _build_optimizer(cfg, ddp.module, hook)
    return PeerEngine(cfg, ddp, optimizer, hook, data_dir, device)
