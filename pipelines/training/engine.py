"""The Megatron-Core training engine of one rank: model, DDP, optimizer, and their state.

The pretrain loop talks to an :class:`Engine` only, whatever the optimizer: dense AdamW /
AdamS through Megatron's DistributedOptimizer, or SCAPE through its subclasses
(``scape.megatron``). Checkpoint state is per rank (ZeRO-style optimizer shards). The peer
baselines (PowerSGD, DGC, 1-bit Adam) use :mod:`pipelines.training.peer_engine` behind the same interface.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from data_prep.dataset import load_prepared, prepared_dir
from data_prep.tokenizers import check_model_vocab
from pipelines.training.config import PEERS, PretrainConfig
from scape.comm import GRAD_VALUES, PARAM_VALUES, ring_bytes_per_rank

__all__ = ["Engine", "EngineCommon", "build_engine", "check_replicas", "model_shape"]


def model_shape(cfg: PretrainConfig):
    from scape.megatron.models import ModelShape

    m = cfg.model
    return ModelShape(
        m.name, m.family, m.num_layers, m.hidden_size, m.num_attention_heads,
        m.ffn_hidden_size, m.vocab_size, m.seq_length, m.num_query_groups,
    )  # fmt: skip


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


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


@dataclass
class Engine(EngineCommon):
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


def build_engine(cfg: PretrainConfig, world_size: int):
    """Model, DDP and optimizer for this rank; the process group must be up.

    An :class:`Engine` (Megatron DDP + distributed optimizer: dense or SCAPE), or for the
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
    spec = OptimizerSpec(
        kind="adamw" if o.name == "adamw" else "adams",
        lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay,
        beta1=o.beta1, beta2=o.beta2, eps=o.eps, clip_grad=o.clip_grad,
    )  # fmt: skip
    ddp_kwargs = dict(
        bucket_size=t.bucket_size,
        overlap_grad_reduce=t.overlap_grad_reduce,
        overlap_param_gather=t.overlap_param_gather,
    )
    if o.name == "scape":
        from scape.megatron.optimizer import build_scape_optimizer

        ddp = wrap_ddp(config, model, **ddp_kwargs)
        optimizer = build_scape_optimizer(
            ddp, spec, o.scape.to_scape_config(), bf16=bf16, check_every=0
        )
    else:
        ddp = wrap_ddp(config, model, **ddp_kwargs)
        optimizer = build_dense_optimizer(ddp, spec, bf16=bf16)
    return Engine(cfg, ddp, optimizer, data_dir, device)
