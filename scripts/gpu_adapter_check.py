"""The SCAPE adapter on one GPU through megatron-core: its step against dense AdamS and AdamW.

Part of ``scripts/gpu_check.sh`` (run by ``scripts/gpu_check.py``; ``--smoke`` runs it alone
at toy sizes on the CPU). In one spawned rank (NCCL on a GPU, W=1, bf16 params with fp32
main params, Megatron's default 40M-element buckets, so every bucket is one a Llama-1.8B run
uses, SDPA attention), for the largest registered shape that fits (Llama-1.8B, else
Llama-500M, else GPT-345M):

* dense AdamS (fused Triton kernel), dense AdamW (torch's fused kernel) and SCAPE-99 (the
  configs' bf16 wire; ``scape.step``'s fused kernels on CUDA), each a few real steps through
  Megatron, timed by phase with CUDA events (forward+backward; grad sync: SCAPE's pack and
  all-reduce, dense's reduce-scatter; the optimizer step), with the memory the run holds
  after its first step (model, grads, optimizer state) and its peak;
* SCAPE against the simulator on the same layout (fp32 params: the simulator's twin is fp32),
  step by step on a small Llama, both on the GPU path: bit-identical params and masks, else
  the largest difference, checked against a stated tolerance.

W=1: the exchange is NCCL's all-reduce of one rank (a copy), not a network's; the parts that
scale with the model (pack, commit, decode, update, select) are the real ones, and
``scripts/gpu_check.py`` times them alone at W=32's shapes.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["adapter_check", "adapter_rank"]

SHAPES_LARGEST_FIRST = ("llama-1.8b", "llama-500m", "gpt-345m")
MEGATRON_DEFAULT_BUCKET = 40_000_000  # elements: Megatron's max(4e7, 1e6 * W) for W <= 40
SPARSITY = 0.99
METHODS = ("dense", "adamw", "scape")  # dense AdamS, dense AdamW, SCAPE-99
# SCAPE vs the simulator on a GPU: the same kernels on the same inputs should give the same
# bits; where a library picks another reduction order the step may differ in the last bits.
SIMULATOR_TOLERANCE = 1e-5


def _mark(cuda: bool):
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _seconds(start, end) -> float:
    """Between two marks (CUDA events: after a synchronize)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


def _median_time(fn, *, cuda: bool, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = _mark(cuda)
        fn()
        end = _mark(cuda)
        if cuda:
            torch.cuda.synchronize()
        times.append(_seconds(start, end))
    return statistics.median(times)


def _peak_bytes(cuda: bool) -> int | None:
    return torch.cuda.max_memory_allocated() if cuda else None


def _free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _method_run(method: str, shape: str, *, steps: int, warmup: int, batch: int,
                bucket_size: int, bf16: bool, device: torch.device) -> dict:  # fmt: skip
    """Real steps of one method through Megatron, timed by phase, with its memory."""
    from scape.config import ScapeConfig
    from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, wrap_ddp
    from scape.megatron.models import SHAPES, build_gpt_model
    from scape.megatron.optimizer import build_scape_optimizer
    from scape.megatron.train import forward_loss

    cuda = device.type == "cuda"
    base = torch.cuda.memory_allocated() if cuda else 0
    model_shape = SHAPES[shape]
    torch.manual_seed(0)  # the methods start from the same weights
    # On a GPU, Megatron initializes the weights there (the CPU takes ~10 s per 1B params).
    config, model = build_gpt_model(model_shape, device=device, bf16=bf16,
                                    use_cpu_initialization=not cuda)  # fmt: skip
    ddp = wrap_ddp(config, model, bucket_size=bucket_size)
    # Every collective inside finish_grad_sync, so that grad sync is one timed phase (Megatron
    # would otherwise use one bucket if overlap were off at construction: same buckets here).
    ddp.ddp_config.overlap_grad_reduce = False
    if method == "scape":
        cfg = ScapeConfig.for_sparsity(SPARSITY, value_dtype="bfloat16")
        opt = build_scape_optimizer(ddp, OptimizerSpec(lr=1e-5), cfg, bf16=bf16, check_every=0)
    else:
        kind = "adams" if method == "dense" else "adamw"
        opt = build_dense_optimizer(ddp, OptimizerSpec(kind=kind, lr=1e-5), bf16=bf16)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model_shape.vocab_size, (batch, model_shape.seq_length + 1),
                           generator=g).to(device)  # fmt: skip
    phases = {"forward_backward_s": [], "grad_sync_s": [], "optimizer_step_s": []}
    losses, held = [], None
    for step in range(warmup + steps):
        marks = [_mark(cuda)]
        ddp.zero_grad_buffer()
        opt.zero_grad()
        loss = forward_loss(ddp, tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        marks.append(_mark(cuda))
        ddp.finish_grad_sync()
        marks.append(_mark(cuda))
        updated, _, _ = opt.step()
        marks.append(_mark(cuda))
        if cuda:
            torch.cuda.synchronize()
        losses.append(float(loss))
        if not updated:
            raise RuntimeError(f"{method}: step {step + 1} was skipped (non-finite gradient)")
        if step == 0 and cuda:  # model, grads and every optimizer state exist from here
            held = torch.cuda.memory_allocated() - base
        if step >= warmup:
            for key, start, end in zip(phases, marks, marks[1:], strict=False):
                phases[key].append(_seconds(start, end))
    out = {
        "params": sum(p.numel() for p in model.parameters()),
        "buckets": len(ddp.buffers[0].buckets),
        "largest_bucket_elems": max(b.grad_data.numel() for b in ddp.buffers[0].buckets),
        "steps_timed": steps,
        **{key: statistics.median(times) for key, times in phases.items()},
        "memory_held_bytes": held,
        "peak_memory_bytes": None if not cuda else _peak_bytes(cuda) - base,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    if method == "scape":
        out["implementation"] = opt.scape.implementation
        out["value_dtype"] = cfg.value_dtype
    return out


def _simulator_run(shape: str, *, steps: int, bucket_size: int, device: torch.device) -> dict:
    """SCAPE through Megatron against the simulator on Megatron's own layout, fp32 params."""
    from scape.adams import AdamHParams
    from scape.config import ScapeConfig
    from scape.megatron.dense import OptimizerSpec, wrap_ddp
    from scape.megatron.layout import flat_layout
    from scape.megatron.models import SHAPES, build_gpt_model
    from scape.megatron.optimizer import build_scape_optimizer
    from scape.megatron.train import forward_loss, train_step
    from scape.simulate import Simulator

    model_shape = SHAPES[shape]
    spec = OptimizerSpec(kind="adams", lr=2e-3, weight_decay=0.1, clip_grad=1.0)
    cfg = ScapeConfig.for_sparsity(SPARSITY)
    torch.manual_seed(0)
    config, model = build_gpt_model(model_shape, device=device)
    ddp = wrap_ddp(config, model, bucket_size=bucket_size)
    opt = build_scape_optimizer(ddp, spec, cfg, check_every=0)
    torch.manual_seed(0)
    _, twin = build_gpt_model(model_shape, device=device)
    hparams = AdamHParams(**spec.shared())
    sim = Simulator(twin, 1, method="scape", hparams=hparams, scape=cfg, layout=flat_layout(ddp))
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, model_shape.vocab_size, (4, 2, model_shape.seq_length + 1),
                         generator=g).to(device)  # fmt: skip

    def sim_loss(m, batch):
        return forward_loss(m, batch[:, :-1], batch[:, 1:])

    per_step = []
    for step in range(steps):
        batch = data[step % len(data)]
        train_step(ddp, opt, (batch[:, :-1], batch[:, 1:]))
        sim.step([batch], sim_loss)
        used, sim_used = opt.scape.last_used_masks or [], sim.last_used_masks or []
        pairs = list(zip(model.parameters(), twin.parameters(), strict=True))
        per_step.append({
            "params_equal": all(torch.equal(a, b) for a, b in pairs),
            "max_abs_diff": max(float((a - b).abs().max()) for a, b in pairs),
            "masks_equal": len(used) == len(sim_used)
            and all(torch.equal(a, b) for a, b in zip(used, sim_used, strict=True)),
        })  # fmt: skip
    worst = max(s["max_abs_diff"] for s in per_step)
    return {
        "shape": shape,
        "steps": steps,
        "sparsity": SPARSITY,
        "bit_identical": all(s["params_equal"] and s["masks_equal"] for s in per_step),
        "max_abs_diff": worst,
        "tolerance": SIMULATOR_TOLERANCE,
        "within_tolerance": worst <= SIMULATOR_TOLERANCE
        and all(s["masks_equal"] for s in per_step),
        "per_step": per_step,
    }


def adapter_rank(rank: int, world_size: int, *, smoke: bool) -> dict:
    """The whole check in one rank process (see the module docstring)."""
    sys.modules.setdefault("wandb", None)  # megatron imports it when it can; never used here
    from scape.megatron.dense import init_megatron
    from scape.megatron.versions import megatron_core_version

    init_megatron(0)
    cuda = torch.cuda.is_available() and not smoke
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    shapes = ("tiny-llama",) if smoke else SHAPES_LARGEST_FIRST
    run = dict(steps=2 if smoke else 4, warmup=2, batch=2 if smoke else 1,
               bucket_size=20_000 if smoke else MEGATRON_DEFAULT_BUCKET, bf16=not smoke,
               device=device)  # fmt: skip
    out = {"megatron_core": megatron_core_version(), "world_size": world_size,
           "device": torch.cuda.get_device_name() if cuda else "cpu", "bf16": run["bf16"],
           "sparsity": SPARSITY, "shapes_tried": []}  # fmt: skip
    for shape in shapes:
        out["shapes_tried"].append(shape)
        results, oom = {}, None
        for method in METHODS:
            _free(cuda)
            try:
                results[method] = _method_run(method, shape, **run)
            except torch.cuda.OutOfMemoryError as err:
                oom = f"{method}: {str(err).splitlines()[0]}"
            if oom:
                break
        _free(cuda)
        if oom is None:
            out.update(shape=shape, **results)
            break
        out.setdefault("out_of_memory", {})[shape] = oom
    if "shape" in out:
        scape, dense = out["scape"], out["dense"]
        # SCAPE's grad sync (its pack and all-reduce) and optimizer step against dense's step
        # (dense's grad sync at W=1 is a no-op)
        out["scape_sync_and_step_vs_dense_step"] = (
            scape["grad_sync_s"] + scape["optimizer_step_s"]
        ) / (dense["grad_sync_s"] + dense["optimizer_step_s"])
        if scape["peak_memory_bytes"] is not None:
            out["scape_peak_vs_dense_peak"] = (
                scape["peak_memory_bytes"] / dense["peak_memory_bytes"]
            )
            out["scape_peak_vs_adamw_peak"] = (
                scape["peak_memory_bytes"] / out["adamw"]["peak_memory_bytes"]
            )
    # Last (the timings are done): deterministic kernels where torch has them, so that a
    # difference from the simulator is SCAPE's, not an atomic add's order in a backward.
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        out["simulator"] = _simulator_run(
            "tiny-llama" if smoke else "small-llama", steps=4 if smoke else 6,
            bucket_size=20_000 if smoke else 1_000_000, device=device,
        )  # fmt: skip
    except Exception as err:  # noqa: BLE001 - keep the timings, report the failure
        out["simulator"] = {"error": f"{type(err).__name__}: {err}"}
    finally:
        torch.use_deterministic_algorithms(False)
    out["ok"] = "shape" in out and bool(out["simulator"].get("within_tolerance"))
    return out


def adapter_check(*, smoke: bool = False, timeout_s: float = 420) -> dict:
    """Run :func:`adapter_rank` in one spawned rank (NCCL on a GPU, gloo for ``smoke``)."""
    from scape.spawn import run_distributed

    backend = "nccl" if torch.cuda.is_available() and not smoke else "gloo"
    # cuBLAS reads this when it starts: needed for its deterministic mode (the simulator check)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    (result,) = run_distributed(adapter_rank, 1, backend=backend, timeout_s=timeout_s, env=env,
                                smoke=smoke)  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (tests the code)")
    p.add_argument("--out", help="write the result as JSON here (default: print it)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_adapter_check: SKIPPED - no CUDA device visible to torch; nothing written.")
        return 0
    result = adapter_check(smoke=args.smoke)
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
