"""The training engine of one rank, registered by name (the one place that decides).

The pretrain loop talks to an engine only, whatever the optimizer. ``train.engine`` names
the engine and ``optimizer.name`` the optimizer; :data:`BUILDERS` maps each supported pair to
the function that builds it, in the manner of torchtitan's train specs:

- ``megatron``: dense AdamW / AdamS and SCAPE through Megatron's DDP and distributed
  optimizer (:class:`~pipelines.training.megatron_engine.MegatronEngine`); the peer
  baselines (PowerSGD, DGC, 1-bit Adam) through torch DDP and a communication hook
  (:class:`~pipelines.training.peer_engine.PeerEngine`);
- ``simulator``: AdamW / AdamS / SCAPE as W workers in one process
  (:class:`~pipelines.training.simulator_engine.SimulatorEngine`), the quality studies'
  vehicle.

Every engine shares :mod:`pipelines.training.engine_base` and the same interface.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from data_prep.dataset import load_prepared, prepared_dir
from data_prep.tokenizers import check_model_vocab
from pipelines.training.config import PretrainConfig, scape_config

__all__ = ["BUILDERS", "BuildContext", "build_engine", "model_shape", "register"]


def model_shape(cfg: PretrainConfig):
    from scape.megatron.models import ModelShape

    m = cfg.model
    return ModelShape(
        m.name, m.family, m.num_layers, m.hidden_size, m.num_attention_heads,
        m.ffn_hidden_size, m.vocab_size, m.seq_length, m.num_query_groups,
    )  # fmt: skip


@dataclass(frozen=True)
class BuildContext:
    """What every builder gets: the run's config, the model (built after Megatron's seeding,
    so every engine starts from the same weights), its Megatron config and where it lives."""

    cfg: PretrainConfig
    shape: Any  # scape.megatron.models.ModelShape
    transformer_config: Any
    model: torch.nn.Module
    data_dir: Path
    device: torch.device
    bf16: bool


Builder = Callable[[BuildContext], Any]
BUILDERS: dict[tuple[str, str], Builder] = {}  # (train.engine, optimizer.name) -> builder


def register(engine: str, *optimizers: str) -> Callable[[Builder], Builder]:
    """Register a builder for ``engine`` and each of ``optimizers``."""

    def add(builder: Builder) -> Builder:
        for name in optimizers:
            BUILDERS[(engine, name)] = builder
        return builder

    return add


def _ddp(ctx: BuildContext):
    from scape.megatron.dense import wrap_ddp

    t = ctx.cfg.train
    return wrap_ddp(ctx.transformer_config, ctx.model, bucket_size=t.bucket_size,
                    overlap_grad_reduce=t.overlap_grad_reduce,
                    overlap_param_gather=t.overlap_param_gather)  # fmt: skip


def _spec(ctx: BuildContext):
    from scape.megatron.dense import OptimizerSpec

    o = ctx.cfg.optimizer
    return OptimizerSpec(kind="adamw" if o.name == "adamw" else "adams", **o.scaled())


@register("megatron", "adamw", "adams")
def _megatron_dense(ctx: BuildContext):
    from pipelines.training.megatron_engine import MegatronEngine
    from scape.megatron.dense import build_dense_optimizer

    ddp = _ddp(ctx)
    optimizer = build_dense_optimizer(ddp, _spec(ctx), bf16=ctx.bf16)
    return MegatronEngine(ctx.cfg, ddp, optimizer, ctx.data_dir, ctx.device)


@register("megatron", "scape")
def _megatron_scape(ctx: BuildContext):
    from pipelines.training.megatron_engine import MegatronEngine
    from scape.megatron.optimizer import build_scape_optimizer

    ddp = _ddp(ctx)
    scape = scape_config(ctx.cfg.optimizer, ctx.cfg.train.train_steps)
    optimizer = build_scape_optimizer(ddp, _spec(ctx), scape,
                                      bf16=ctx.bf16, check_every=0)  # fmt: skip
    return MegatronEngine(ctx.cfg, ddp, optimizer, ctx.data_dir, ctx.device)


@register("megatron", "powersgd", "dgc", "onebit")
def _megatron_peer(ctx: BuildContext):
    from pipelines.training.peer_engine import build_peer_engine

    return build_peer_engine(ctx.cfg, ctx.model, ctx.data_dir, ctx.device)


@register("simulator", "adamw", "adams", "scape")
def _simulator(ctx: BuildContext):
    from pipelines.training.simulator_engine import build_simulator_engine

    return build_simulator_engine(ctx.cfg, ctx.shape, ctx.model, ctx.data_dir, ctx.device)


def build_engine(cfg: PretrainConfig) -> Any:
    """Model and engine for this rank; the process group must be up."""
    from scape.megatron.dense import init_megatron
    from scape.megatron.models import build_gpt_model

    key = (cfg.train.engine, cfg.optimizer.name)
    if key not in BUILDERS:
        supported = sorted(n for e, n in BUILDERS if e == cfg.train.engine)
        raise ValueError(f"train.engine={key[0]} does not run optimizer.name={key[1]}; "
                         f"it runs {', '.join(supported)}")  # fmt: skip
    data_dir = prepared_dir(cfg.data_root, cfg.data.name, cfg.tokenizer.name)
    shape = model_shape(cfg)
    prepared = load_prepared(data_dir, verify_hashes=False)
    check_model_vocab(cfg.tokenizer.name, prepared.vocab_size, shape.padded_vocab_size)
    init_megatron(seed=cfg.train.seed)
    use_gpu = torch.cuda.is_available() and cfg.cluster.gpus_per_node > 0
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if use_gpu
        else torch.device("cpu")
    )
    bf16 = cfg.train.precision == "bf16"
    if bf16 and not use_gpu:
        raise ValueError("train.precision=bf16 needs a GPU; use train.precision=fp32 on CPU")
    config, model = build_gpt_model(shape, device=device, bf16=bf16)
    return BUILDERS[key](BuildContext(cfg, shape, config, model, data_dir, device, bf16))
