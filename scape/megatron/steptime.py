"""Per-step wall time of dense AdamS vs SCAPE through Megatron, on W ranks.

    python -m scape.megatron.steptime --ranks 2 --shape tiny-gpt --steps 30 --density 0.01

Each method runs in its own spawned job (gloo on CPU, NCCL on GPUs) with synthetic tokens,
Megatron's overlap of gradient reduce-scatters with backward and of parameter all-gathers with
the next forward; the first ``--warmup`` steps are not timed. Prints one JSON line per method
with rank 0's median and mean step wall time, its median CPU time per step, and SCAPE's bytes
per rank per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

__all__ = ["time_steps"]


def time_steps(
    rank: int,
    world_size: int,
    *,
    shape: str,
    method: str,
    density: float,
    steps: int,
    warmup: int,
    batch: int,
    bucket_size: int | None,
    bf16: bool,
) -> dict:
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
    if method == "scape":
        opt = build_scape_optimizer(ddp, spec, ScapeConfig.for_sparsity(1.0 - density), bf16=bf16)
    else:
        opt = build_dense_optimizer(ddp, spec, bf16=bf16)
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(
        0, model_shape.vocab_size, (batch, model_shape.seq_length + 1), generator=g
    ).to(device)
    times, cpu_times, losses = [], [], []
    counter_start = None
    for step in range(warmup + steps):
        if step == warmup and method == "scape":
            counter_start = opt.scape.comm.counter.snapshot()
        cpu = time.process_time()
        result = train_step(ddp, opt, (tokens[:, :-1], tokens[:, 1:]))
        cpu = time.process_time() - cpu
        losses.append(result.loss)
        if step >= warmup:
            times.append(result.seconds)
            cpu_times.append(cpu)
    out = {
        "method": method,
        "shape": shape,
        "params": sum(p.numel() for p in model.parameters()),
        "world_size": world_size,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "median_step_s": statistics.median(times),
        "mean_step_s": statistics.fmean(times),
        # CPU seconds of this rank's process (all its threads, gloo's included) per step: on a
        # shared machine a load-independent measure of the work, next to the wall time.
        "median_step_cpu_s": statistics.median(cpu_times),
        "steps_timed": len(times),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    if method == "scape":
        end = opt.scape.comm.counter.snapshot()
        out["density"] = density
        out["bytes_per_rank_per_step"] = {
            k: (v - counter_start.get(k, 0.0)) / steps for k, v in end.items()
        }
    return out


def main(argv: list[str] | None = None) -> int:
    from scape.megatron.models import SHAPES
    from scape.spawn import run_distributed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--shape", default="tiny-gpt", choices=sorted(SHAPES))
    p.add_argument("--methods", default="dense,scape")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--bucket-size", type=int, default=None, help="elements; Megatron's default")
    p.add_argument("--bf16", action="store_true", help="bf16 params (default on CUDA)")
    args = p.parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    for method in args.methods.split(","):
        (result, *_) = run_distributed(
            time_steps,
            args.ranks,
            backend=backend,
            timeout_s=3600,
            shape=args.shape,
            method=method,
            density=args.density,
            steps=args.steps,
            warmup=args.warmup,
            batch=args.batch,
            bucket_size=args.bucket_size,
            bf16=args.bf16 or torch.cuda.is_available(),
        )
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
