"""Per-step wall time of dense AdamS or SCAPE through Megatron, one spawned job (GPU check).

``scripts/gpu_check.py`` runs :func:`time_steps` with ``scape.spawn.run_distributed`` (NCCL
on GPUs, gloo on CPU): synthetic tokens, Megatron's overlap of gradient reduce-scatters with
backward and of parameter all-gathers with the next forward; the first ``warmup`` steps are
not timed. Returns rank 0's median and mean step, its median CPU time per step and, for
SCAPE, the bytes per rank per step.
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["time_steps"]


def time_steps(rank: int, world_size: int, *, shape: str, sparsity: float | None, steps: int,
               warmup: int, batch: int, bucket_size: int | None, bf16: bool) -> dict:  # fmt: skip
    """``sparsity`` None: dense AdamS; else SCAPE at that sparsity."""
    from scape.config import ScapeConfig
    from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, init_megatron, wrap_ddp
    from scape.megatron.models import SHAPES, build_gpt_model
    from scape.megatron.optimizer import build_scape_optimizer
    from scape.megatron.train import train_step

    init_megatron(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_shape = SHAPES[shape]
    config, model = build_gpt_model(model_shape, device=device, bf16=bf16)
    ddp = wrap_ddp(config, model, bucket_size=bucket_size, overlap_param_gather=True)
    spec = OptimizerSpec(kind="adams", lr=1e-4)
    if sparsity is None:
        opt = build_dense_optimizer(ddp, spec, bf16=bf16)
    else:
        opt = build_scape_optimizer(ddp, spec, ScapeConfig.for_sparsity(sparsity), bf16=bf16)
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, model_shape.vocab_size, (batch, model_shape.seq_length + 1),
                           generator=g).to(device)  # fmt: skip
    times, cpu_times, losses = [], [], []
    counter_start = None
    for step in range(warmup + steps):
        if step == warmup and sparsity is not None:
            counter_start = opt.scape.comm.counter.snapshot()
        cpu = time.process_time()
        result = train_step(ddp, opt, (tokens[:, :-1], tokens[:, 1:]))
        cpu = time.process_time() - cpu
        losses.append(result.loss)
        if step >= warmup:
            times.append(result.seconds)
            cpu_times.append(cpu)
    out = {"method": "dense" if sparsity is None else "scape", "shape": shape,
           "params": sum(p.numel() for p in model.parameters()), "world_size": world_size,
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "median_step_s": statistics.median(times), "mean_step_s": statistics.fmean(times),
           # CPU seconds of this rank's process (all threads) per step: on a shared machine a
           # load-independent measure of the work, next to the wall time
           "median_step_cpu_s": statistics.median(cpu_times), "steps_timed": len(times),
           "first_loss": losses[0], "last_loss": losses[-1]}  # fmt: skip
    if sparsity is not None:
        end = opt.scape.comm.counter.snapshot()
        out["sparsity"] = sparsity
        out["bytes_per_rank_per_step"] = {k: (v - counter_start.get(k, 0.0)) / steps
                                          for k, v in end.items()}  # fmt: skip
    return out
