"""The training engine of one rank, chosen by the optimizer's kind (the one place that decides).

The pretrain loop talks to an engine only, whatever the optimizer: dense AdamW / AdamS and
SCAPE run in a :class:`~pipelines.training.megatron_engine.MegatronEngine`, the peer
baselines (PowerSGD, DGC, 1-bit Adam) in a :class:`~pipelines.training.peer_engine.PeerEngine`;
both share :mod:`pipelines.training.engine_base` and the same interface.
"""

from __future__ import annotations

import os

import torch

from data_prep.dataset import load_prepared, prepared_dir
from data_prep.tokenizers import check_model_vocab
from pipelines.training.config import PEERS, PretrainConfig, scape_config
from pipelines.training.megatron_engine import MegatronEngine

__all__ = ["build_engine", "model_shape"]


def model_shape(cfg: PretrainConfig):
    from scape.megatron.models import ModelShape

    m = cfg.model
    return ModelShape(
        m.name, m.family, m.num_layers, m.hidden_size, m.num_attention_heads,
        m.ffn_hidden_size, m.vocab_size, m.seq_length, m.num_query_groups,
    )  # fmt: skip


def build_engine(cfg: PretrainConfig, world_size: int):
    """Model, DDP and optimizer for this rank; the process group must be up.

    A :class:`MegatronEngine` (Megatron DDP + distributed optimizer: dense or SCAPE), or for the
    peer baselines a :class:`pipelines.training.peer_engine.PeerEngine` with the same interface.
    """
    from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, init_megatron, wrap_ddp
    from scape.megatron.models import build_gpt_model

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
    o, t = cfg.optimizer, cfg.train
    if o.name in PEERS:
        from pipelines.training.peer_engine import build_peer_engine

        return build_peer_engine(cfg, model, data_dir, device)
    spec = OptimizerSpec(kind="adamw" if o.name == "adamw" else "adams", **o.scaled())
    ddp_kwargs = dict(
        bucket_size=t.bucket_size,
        overlap_grad_reduce=t.overlap_grad_reduce,
        overlap_param_gather=t.overlap_param_gather,
    )
    if o.name == "scape":
        from scape.megatron.optimizer import build_scape_optimizer

        ddp = wrap_ddp(config, model, **ddp_kwargs)
        optimizer = build_scape_optimizer(ddp, spec, scape_config(o), bf16=bf16, check_every=0)
    else:
        ddp = wrap_ddp(config, model, **ddp_kwargs)
        optimizer = build_dense_optimizer(ddp, spec, bf16=bf16)
    return MegatronEngine(cfg, ddp, optimizer, data_dir, device)
