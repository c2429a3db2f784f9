"""Dense baselines through stock megatron-core: DDP + DistributedOptimizer (ZeRO-1).

Two inner optimizers behind Megatron's ``DistributedOptimizer``, fp32 main params:

* ``adamw``: Megatron's own Adam in AdamW mode, built by ``get_megatron_optimizer``. Without
  Transformer Engine or Apex that is ``torch.optim.AdamW``, which Megatron builds with its
  default, foreach kernels; on CUDA it is switched to torch's fused kernel (one pass), the
  baseline a GPU user would have (the same arithmetic, to rounding);
* ``adams``: our :class:`scape.adams.AdamS`. Megatron's factory builds only Adam/SGD, and
  ``DistributedOptimizer.__init__`` asserts an Adam-class inner optimizer. So we let the stock
  factory build everything (parameter groups with Megatron's weight-decay rules, shard-sized
  fp32 main params, grad-buffer ranges, the chained optimizer) around an Adam that has never
  stepped and therefore holds no state, then hand the very same parameter groups to AdamS.
  The shard bookkeeping never looks at the inner optimizer's class, only at its groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

from scape.adams import AdamHParams, AdamS
from scape.megatron.cpu_compat import install_cpu_compat

__all__ = ["OptimizerSpec", "build_dense_optimizer", "init_megatron", "wrap_ddp"]


def init_megatron(seed: int = 1234) -> None:
    """Per process, after ``torch.distributed`` is up: CPU compat, TP=PP=1 groups, RNG seeds.

    All ranks get the same seed, so they initialize identical weights (Megatron's own
    ``model_parallel_cuda_manual_seed`` also seeds the data-parallel stream identically).
    """
    from megatron.core import parallel_state, tensor_parallel

    install_cpu_compat()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def wrap_ddp(
    config,
    model: torch.nn.Module,
    *,
    bucket_size: int | None = None,
    overlap_grad_reduce: bool = True,
    overlap_param_gather: bool = False,
    grad_reduce_in_fp32: bool = True,
    ddp_cls: type | None = None,
):
    """Wrap ``model`` in Megatron's DDP with the distributed-optimizer buffer layout.

    ``bucket_size`` is in elements (Megatron's default is ``max(4e7, 1e6 * dp)``; tests use
    small values to get several buckets). Only meaningful with ``overlap_grad_reduce`` (without
    it Megatron uses one bucket). ``ddp_cls`` lets the SCAPE adapter pass its subclass.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather,
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        bucket_size=bucket_size,
    )
    cls = ddp_cls or DistributedDataParallel
    return cls(config, ddp_config, model)


@dataclass
class OptimizerSpec(AdamHParams):
    """The shared hyper-parameters (:class:`scape.adams.AdamHParams`) and which dense rule
    steps with them (SCAPE ignores ``kind``: its update is its own)."""

    kind: Literal["adamw", "adams"] = "adams"


def megatron_optimizer_config(spec: OptimizerSpec, *, bf16: bool = False):
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(
        optimizer="adam",
        lr=spec.lr,
        min_lr=spec.min_lr,
        weight_decay=spec.weight_decay,
        adam_beta1=spec.beta1,
        adam_beta2=spec.beta2,
        adam_eps=spec.eps,
        clip_grad=spec.clip_grad,
        bf16=bf16,
        use_distributed_optimizer=True,
    )


def adams_init_state(opt: torch.optim.Optimizer, config=None) -> None:
    """Megatron's ``init_state_fn`` hook for AdamS: zero first moment, step 0."""
    for group in opt.param_groups:
        for p in group["params"]:
            if len(opt.state[p]) == 0:
                opt.state[p]["step"] = torch.tensor(0.0)
                opt.state[p]["exp_avg"] = torch.zeros_like(p.data)


def set_hyperparams(optimizer, *, lr: float, weight_decay: float) -> None:
    """Set per-group lr and weight decay the way ``OptimizerParamScheduler.step`` does.

    Megatron groups carry ``lr_mult`` and ``wd_mult`` (``wd_mult`` is 0 for biases and norm
    weights); the scheduler, not the factory, applies them. Call once per step with a schedule,
    or once after building for constant hyper-parameters.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
        group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)


def build_dense_optimizer(ddp, spec: OptimizerSpec, *, bf16: bool = False):
    """Megatron ``DistributedOptimizer`` (inside a ``ChainedOptimizer``, re-classed to
    :class:`scape.megatron.dense_optimizer.DenseOptimizer`) with AdamW or AdamS."""
    from megatron.core.optimizer import ChainedOptimizer, get_megatron_optimizer

    from scape.megatron.dense_optimizer import DenseOptimizer

    install_cpu_compat()
    chained = get_megatron_optimizer(megatron_optimizer_config(spec, bf16=bf16), [ddp])
    if type(chained) is not ChainedOptimizer:
        raise TypeError(f"get_megatron_optimizer built {type(chained).__name__}, not a "
                        "ChainedOptimizer; see scape/megatron/versions.py")  # fmt: skip
    chained.__class__ = DenseOptimizer  # adds the engine's calls, keeps Megatron's
    chained.ddp, chained.steps_taken = ddp, 0
    if spec.kind == "adams":
        for dist_opt in chained.chained_optimizers:
            groups = dist_opt.optimizer.param_groups
            assert not dist_opt.optimizer.state, "the placeholder Adam must not have stepped"
            adams = AdamS(
                [torch.zeros(1)], lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps
            )
            # The shard params are views (non-leaf for fp32 models), which torch's
            # add_param_group refuses; assign the groups the way DistributedOptimizer.__init__
            # assigns them to its own inner Adam.
            for group in groups:
                for key, default in adams.defaults.items():
                    group.setdefault(key, default)
            adams.param_groups = groups
            dist_opt.optimizer = adams
            dist_opt.init_state_fn = adams_init_state
    elif spec.kind == "adamw":
        for dist_opt in chained.chained_optimizers:
            inner = dist_opt.optimizer
            params = [p for g in inner.param_groups for p in g["params"]]
            fusable = isinstance(inner, torch.optim.AdamW) and not inner.state and params
            if fusable and all(p.is_cuda for p in params):
                for group in inner.param_groups:  # read at every step; no state exists yet
                    group["fused"], group["foreach"] = True, False
    else:
        raise ValueError(f"unknown optimizer kind {spec.kind!r}")
    set_hyperparams(chained, lr=spec.lr, weight_decay=spec.weight_decay)
    return chained
