"""GPU check: one prepared run, offline, within 6 minutes on one CUDA GPU.

0. The memory floor on this GPU: one fp32 copy pass (read + write) over N entries, N the
   parameter count of Llama-1.8B, with CUDA events.
1. One rank's SCAPE work per step at Llama-1.8B for W=32 (Megatron's 40M-entry buckets, 1.25M
   entries per shard, the configs' bf16 wire), through :mod:`scape.step` as the adapter runs
   it: ``pack`` of every bucket, ``finish`` (commit, decode, weight decay, rms update, bf16
   params) of every bucket, the owner's ``select`` of its shard of every bucket, and the three
   together; each against the floor (one copy pass) and against the traffic floor (the bytes
   the step must move, at the copy's bandwidth). Beside them the dense baselines' update of
   the rank's ZeRO-1 shard (fused AdamS, torch's fused AdamW), and the blocked (CPU) path's
   work on one bucket, times the buckets.
2. The adapter through megatron-core on this GPU (W=1, NCCL, bf16, Llama-1.8B, SDPA
   attention): dense AdamS, dense AdamW and SCAPE-99 by phase with their peak memory, and
   SCAPE against the simulator (:mod:`gpu_adapter_check`, next to this file).
3. GPT-345M whole steps through Megatron (W=1, 8 sequences of 1,024, SDPA attention): dense
   AdamS and AdamW, SCAPE-90 and SCAPE-99; the dense AdamS step's MFU calibrates
   ``make bench-project``.

Every part is saved as soon as it is done (a run cut short keeps what it measured), and a
part that would not fit in what is left of ``--budget-s`` is skipped and says so. Writes
``results/gpu/gpu_check_<gpu>_<utc date>.json`` with the GPU, versions, commit and 1-minute
load average. Without CUDA it says so and exits 0 without writing anything (``--cpu-smoke``
runs the same code at toy sizes on the CPU, to test the script). Run it with
``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.training.provenance import git_version  # noqa: E402
from scape.config import ScapeConfig  # noqa: E402
from scape.megatron.models import SHAPES, count_params  # noqa: E402
from scape.step import Geometry, Update, make_bucket_step, resolve_implementation  # noqa: E402

# Bytes a fused SCAPE step moves per entry of a rank's buckets: pack reads m and g (8);
# finish reads m, g, p, v (16), writes m, p, v (12) and the bf16 params (2), and reads the
# weight-decay bitmap (1/8). The select (its owned 1/W) and the wire (1/100) are left out.
TRAFFIC_BYTES_PER_ENTRY = 8 + 16 + 12 + 2 + 1 / 8


def environment() -> dict:
    env = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version()))
        if torch.cuda.is_available()
        else None,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load_average_1min": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    for package in ("megatron-core", "triton"):
        try:
            from importlib.metadata import version

            env[package.replace("-", "_")] = version(package)
        except Exception as err:  # noqa: BLE001 - report, don't fail
            env[package.replace("-", "_")] = f"unavailable: {err}"
    version = git_version(ROOT)
    env["git_commit"], env["git_dirty"] = version["commit"], version["dirty"]
    # A lent machine's copy of the tree may carry another .git than the one it was sent from
    # (the 2026-12-04 18:33 run saw the session's first commit, "dirty"): the caller states
    # the commit it sent, `SCAPE_COMMIT=$(git rev-parse HEAD)`, and both are kept.
    env["git_commit_stated"] = os.environ.get("SCAPE_COMMIT")
    return env


class Timer:
    """Median wall time of a callable: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def __call__(self, fn) -> float:
        fn()  # warm-up (kernels compiled, caches, allocator)
        times = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)


def _fused_adamw_update(param, exp_avg, exp_avg_sq, grad, state_step) -> None:
    """torch's fused AdamW kernel, as ``torch.optim.AdamW(fused=True)`` steps one tensor."""
    torch._fused_adamw_(
        [param], [grad], [exp_avg], [exp_avg_sq], [], [state_step], amsgrad=False, lr=1e-4,
        beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, maximize=False,
    )  # fmt: skip


def kernel_microbench(*, total_params: int, world_size: int, bucket_size: int, sparsities,
                      device: torch.device, repeats: int,
                      implementation: str | None = None) -> dict:  # fmt: skip
    """One rank's SCAPE work per step for a model of ``total_params`` in Megatron-like buckets
    (``bucket_size`` entries, padded to a multiple of lcm(W, 128)), W ranks, chunks of 100,
    against the memory floor measured here (see the module docstring)."""
    implementation = resolve_implementation(implementation, device)
    pad = math.lcm(world_size, 128)
    bucket = math.ceil(bucket_size / pad) * pad
    n_buckets = math.ceil(total_params / bucket)
    shard = bucket // world_size
    numel = n_buckets * bucket
    timer = Timer(device, repeats)
    moment, grad, param, second, param_out = step_state(numel, device)
    out = {"implementation": implementation, "total_params": total_params,
           "world_size": world_size, "bucket_elems": bucket, "buckets": n_buckets,
           "shard_elems": shard, "entries": numel, "per_rank_owned_elems": n_buckets * shard}  # fmt: skip
    floor = _copy_pass(timer, moment)
    out["floor_copy_pass_s"] = floor
    out["copy_bandwidth_Bps"] = 8 * numel / floor
    traffic_floor = floor * TRAFFIC_BYTES_PER_ENTRY / 8
    out["traffic_floor_s"] = traffic_floor
    out["traffic_bytes_per_entry"] = TRAFFIC_BYTES_PER_ENTRY
    if device.type == "cuda":  # the dense baselines' update of the rank's ZeRO-1 shard
        out.update(_dense_shard_updates(timer, param, moment, grad, n_buckets * shard))
    for sparsity in sparsities:
        cfg = ScapeConfig.for_sparsity(sparsity, value_dtype="bfloat16")
        out[f"sparsity_{sparsity}"] = _time_step(
            timer, implementation, cfg, moment, grad, param, second, param_out,
            bucket=bucket, shard=shard, world_size=world_size, traffic_floor=traffic_floor,
            floor=floor,
        )  # fmt: skip
        out[f"sparsity_{sparsity}"]["blocked_one_bucket_times_buckets_s"] = (
            _time_blocked_bucket(timer, cfg, moment, grad, param, second, bucket=bucket,
                                 shard=shard, world_size=world_size) * n_buckets  # fmt: skip
            if implementation != "blocked" else None
        )  # fmt: skip
    return out


def step_state(numel: int, device) -> tuple[torch.Tensor, ...]:
    """A rank's step state over ``numel`` entries, seeded: moment, grad, fp32 params, second
    moment and the bf16 params."""
    gen = torch.Generator(device=device).manual_seed(0)
    moment = torch.randn(numel, device=device, generator=gen).mul_(0.01)
    grad = torch.randn(numel, device=device, generator=gen)
    param = torch.randn(numel, device=device, generator=gen)
    second = torch.rand(numel, device=device, generator=gen).mul_(1e-4)
    return moment, grad, param, second, torch.empty(numel, dtype=torch.bfloat16, device=device)


def _copy_pass(timer, x) -> float:
    """One fp32 read and write pass over ``x``: the floor a pass over memory costs here."""
    target = torch.empty_like(x)
    return timer(lambda: target.copy_(x))


def _dense_shard_updates(timer, param, moment, grad, owned: int) -> dict:
    """Fused AdamS and torch's fused AdamW over ``owned`` entries: what the dense baselines
    do per step on one rank's ZeRO-1 shard (copies: the buffers stay as they were)."""
    from scape.fused import adams_fused_

    p, m, g = param[:owned].clone(), moment[:owned].clone(), grad[:owned]
    v, step = torch.zeros_like(p), torch.tensor(10.0, device=p.device)
    return {
        "dense_adams_fused_shard_s": timer(lambda: adams_fused_(
            p, m, g, step=10, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)),
        "dense_adamw_fused_shard_s": timer(lambda: _fused_adamw_update(p, m, v, g, step)),
    }  # fmt: skip


def _bucket_step(implementation, cfg, device, *, bucket, shard, world_size):
    geo = Geometry(shard, world_size, cfg.chunk, cfg.k)
    return make_bucket_step(implementation, geo, 0, cfg, device, [(0, bucket)], 1e-8)


def _time_step(timer, implementation, cfg, moment, grad, param, second, param_out, *, bucket,
               shard, world_size, traffic_floor, floor) -> dict:  # fmt: skip
    """The parts of one rank's step over every bucket, each timed alone, then together."""
    device = moment.device
    step = _bucket_step(implementation, cfg, device, bucket=bucket, shard=shard,
                        world_size=world_size)  # fmt: skip
    n_buckets = moment.numel() // bucket
    spans = [slice(b * bucket, (b + 1) * bucket) for b in range(n_buckets)]
    # every shard's mask as its owner makes it, from bucket 0's moment (the same for all)
    masks = torch.empty(world_size, step.num_selected, dtype=torch.int64, device=device)
    for j in range(world_size):
        _select(step, moment[j * shard : (j + 1) * shard], masks[j])
    payload = torch.zeros(n_buckets * step.payload_numel(False), dtype=step.wire_dtype,
                          device=device)  # fmt: skip
    payloads = payload.split(step.payload_numel(False))
    next_mask = torch.empty(step.num_selected, dtype=torch.uint8, device=device)
    clip = torch.ones(1, device=device)

    def update(span):
        return Update(param=param[span], second_moment=second[span], param_out=param_out[span],
                      decay_factor=1.0 - 1e-4 * 0.1, lr=1e-4, step=10, clip=clip)  # fmt: skip

    def pack_all():
        for span, pl in zip(spans, payloads, strict=True):
            step.pack(moment[span], grad[span], masks, pl)

    def finish_all(select: bool = False):
        for span, pl in zip(spans, payloads, strict=True):
            step.finish(moment[span], grad[span], masks, pl[:-1], update=update(span),
                        next_mask=next_mask if select else None)  # fmt: skip

    def select_all():
        for span in spans:
            _select(step, moment[span][:shard], next_mask)

    def whole_step():
        pack_all()
        finish_all(select=True)

    row = {"k_per_chunk": cfg.k, "selected_per_shard": step.num_selected,
           "value_dtype": cfg.value_dtype, "pack_s": timer(pack_all),
           "finish_s": timer(finish_all), "select_s": timer(select_all),
           "step_s": timer(whole_step)}  # fmt: skip
    row["step_vs_copy_pass"] = row["step_s"] / floor
    row["step_vs_traffic_floor"] = row["step_s"] / traffic_floor
    return row


def _select(step, moment_shard, out) -> None:
    """The owner's mask of one shard, as ``finish`` makes it (through the implementation)."""
    if step.implementation == "fused":
        step._kernels.select(step.geo, moment_shard, None, step._dct, out,
                             beta=step.config.moment_beta)  # fmt: skip
    else:
        from scape.shard import owner_mask

        out.copy_(owner_mask(step.basis, moment_shard))


def _time_blocked_bucket(timer, cfg, moment, grad, param, second, *, bucket, shard,
                         world_size) -> float:  # fmt: skip
    """The blocked (CPU-tuned) path's pack, finish and select of one bucket on this device."""
    device = moment.device
    step = _bucket_step("blocked", cfg, device, bucket=bucket, shard=shard,
                        world_size=world_size)  # fmt: skip
    span = slice(0, bucket)
    m, g = moment[span].clone(), grad[span]
    masks = torch.stack([step.basis.select(m[j * shard : (j + 1) * shard])
                         for j in range(world_size)])  # fmt: skip
    payload = torch.zeros(step.payload_numel(False), dtype=step.wire_dtype, device=device)
    mask = torch.empty(step.num_selected, dtype=torch.int64, device=device)
    update = Update(param=param[span], second_moment=second[span], param_out=None,
                    decay_factor=1.0 - 1e-5, lr=1e-4, step=10, clip=1.0)  # fmt: skip

    def one_bucket():
        step.pack(m, g, masks, payload)
        step.finish(m, g, masks, payload[:-1], update=update, next_mask=mask)

    return timer(one_bucket)


def time_steps(rank: int, world_size: int, *, shape: str, method: str, steps: int,
               warmup: int, batch: int, bf16: bool) -> dict:  # fmt: skip
    """Rank 0's median step wall time of ``method`` (``adams``, ``adamw``, ``scape90``,
    ``scape99``) through Megatron (gloo on CPU, NCCL on GPUs): synthetic tokens, Megatron's
    overlap of gradient reduce-scatters with backward and of parameter all-gathers with the
    next forward, the first ``warmup`` steps not timed; SCAPE's bytes per rank per step."""
    from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, init_megatron, wrap_ddp
    from scape.megatron.models import build_gpt_model
    from scape.megatron.optimizer import build_scape_optimizer
    from scape.megatron.train import train_step

    init_megatron(0)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model_shape = SHAPES[shape]
    config, model = build_gpt_model(model_shape, device=device, bf16=bf16)
    ddp = wrap_ddp(config, model, overlap_param_gather=True)
    sparsity = {"scape90": 0.9, "scape99": 0.99}.get(method)
    if sparsity is None:
        opt = build_dense_optimizer(ddp, OptimizerSpec(kind=method, lr=1e-4), bf16=bf16)
    else:
        cfg = ScapeConfig.for_sparsity(sparsity, value_dtype="bfloat16")
        opt = build_scape_optimizer(ddp, OptimizerSpec(lr=1e-4), cfg, bf16=bf16, check_every=0)
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, model_shape.vocab_size, (batch, model_shape.seq_length + 1),
                           generator=g).to(device)  # fmt: skip
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(warmup + steps):
        result = train_step(ddp, opt, (tokens[:, :-1], tokens[:, 1:]))
        losses.append(result.loss)
        if step >= warmup:
            times.append(result.seconds)
    return {"method": method, "shape": shape, "batch": batch,
            "tokens_per_step": batch * model_shape.seq_length,
            "params": sum(p.numel() for p in model.parameters()), "world_size": world_size,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "attention": "sdpa" if cuda else "local",
            "median_step_s": statistics.median(times), "mean_step_s": statistics.fmean(times),
            "steps_timed": len(times), "first_loss": losses[0], "last_loss": losses[-1],
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None}  # fmt: skip


def megatron_steps(*, shape: str, methods, steps: int, warmup: int, batch: int, cpu: bool,
                   deadline: float) -> list:  # fmt: skip
    from scape.spawn import run_distributed

    results = []
    for method in methods:
        if time.perf_counter() > deadline:
            results.append({"method": method, "skipped": "out of the check's time budget"})
            continue
        try:
            (res,) = run_distributed(time_steps, 1, backend="gloo" if cpu else "nccl",
                                     timeout_s=240, shape=shape, method=method, steps=steps,
                                     warmup=warmup, batch=batch, bf16=not cpu)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - keep the other methods, report the failure
            res = {"method": method, "error": f"{type(err).__name__}: {str(err)[-2000:]}"}
        print(json.dumps(res), flush=True)
        results.append(res)
    dense = next((r for r in results if r.get("method") == "adams" and "median_step_s" in r), None)
    for r in results:
        if dense and "median_step_s" in r:
            r["vs_dense_adams"] = r["median_step_s"] / dense["median_step_s"]
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--cpu-smoke", action="store_true", help="toy sizes on the CPU (tests the script)"
    )
    p.add_argument("--out-dir", default=str(ROOT / "results" / "gpu"))
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="parts that would start after this many seconds are skipped")  # fmt: skip
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpu_check: SKIPPED - no CUDA device visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing written.")  # fmt: skip
        return 0
    started = time.perf_counter()
    report = {"environment": environment(), "status": "running", "budget_s": args.budget_s}
    out_dir = Path(args.out_dir)
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", report["environment"]["gpu"] or "cpu-smoke").strip("-")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"gpu_check_{gpu}_{stamp}.json"

    def save() -> None:  # after each part: a run cut short keeps what it measured
        out_dir.mkdir(parents=True, exist_ok=True)
        report["wall_s"] = time.perf_counter() - started
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(path)

    def left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    # 1. one rank's kernels at W=32, against the floor measured on the same GPU
    try:
        report["kernels"] = kernel_microbench(
            total_params=200_000 if smoke else count_params(SHAPES["llama-1.8b"]),
            world_size=32, bucket_size=40_000 if smoke else 40_000_000, sparsities=[0.9, 0.99],
            device=device, repeats=2 if smoke else 5,
        )  # fmt: skip
    except Exception as err:  # noqa: BLE001 - keep the other parts, report the failure
        report["kernels"] = {"error": f"{type(err).__name__}: {err}"}
    save()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # 2. the adapter at the largest shape that fits (scripts/gpu_adapter_check.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_adapter_check import adapter_check

    if left() > 120 or smoke:
        try:
            report["adapter"] = adapter_check(smoke=smoke, timeout_s=max(60.0, left() - 60))
        except Exception as err:  # noqa: BLE001 - keep the other parts, report the failure
            report["adapter"] = {"error": f"{type(err).__name__}: {str(err)[-2000:]}"}
    else:
        report["adapter"] = {"skipped": f"out of the check's time budget ({left():.0f} s left)"}
    save()
    # 3. GPT-345M whole steps (the dense AdamS one calibrates the projection's MFU)
    report["megatron"] = megatron_steps(
        shape="tiny-gpt" if smoke else "gpt-345m", methods=("adams", "adamw", "scape90", "scape99"),
        steps=2 if smoke else 8, warmup=1 if smoke else 3, batch=2 if smoke else 8, cpu=smoke,
        deadline=started + args.budget_s - (0 if smoke else 25),
    )  # fmt: skip
    report["status"] = "ok"
    save()
    print(f"gpu_check: wrote {path} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
