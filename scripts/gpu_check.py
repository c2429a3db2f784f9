"""GPU readiness check: one prepared run, offline, under 9 minutes on one CUDA GPU.

0. The SCAPE adapter through megatron-core at the largest shape that fits (Llama-1.8B first):
   dense AdamS's and SCAPE-99's steps by phase and peak memory, SCAPE's optimizer step by part
   and SCAPE against the simulator (:mod:`gpu_adapter_check`, next to this file); written to
   the report as soon as it is done.
1. A few dense-AdamS and SCAPE steps (90% and 99% sparsity) of GPT-345M through Megatron on
   one GPU (W=1, NCCL, bf16 params, fp32 main params): step times, losses, bytes.
2. A micro-benchmark of SCAPE's per-step kernels at Llama-1.8B sizes for W=32 (the work one
   rank of 32 does): the owner's mask selection (top-k per chunk of its shards' DCT), packing
   the candidate moment at every shard's mask, removing what was sent, decoding the summed
   buffer and the rms update of every entry, timed with CUDA events, against the dense
   AdamS update of the rank's ZeRO-1 shard (what the dense baseline does per step).

Writes ``results/gpu/gpu_check_<gpu>_<utc date>.json`` with the GPU name, versions and date.
Without CUDA it says so and exits 0 without writing anything (``--cpu-smoke`` runs the same
code at toy sizes on the CPU, to test the script itself). Run it with ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
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
from scape.adams import adams_update_  # noqa: E402
from scape.basis import ShardBasis  # noqa: E402
from scape.config import coefficients_per_chunk  # noqa: E402
from scape.megatron.models import SHAPES, count_params  # noqa: E402
from scape.shard import accumulate, commit_moment_, decode, owner_mask, pack, rms_update_  # noqa: E402


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
    }
    try:
        from importlib.metadata import version

        env["megatron_core"] = version("megatron-core")
    except Exception as err:  # noqa: BLE001 - report, don't fail
        env["megatron_core"] = f"unavailable: {err}"
    version = git_version(ROOT)
    env["git_commit"], env["git_dirty"] = version["commit"], version["dirty"]
    return env


class Timer:
    """Median wall time of a callable: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def __call__(self, fn) -> float:
        fn()  # warm-up (kernels, caches, allocator)
        times = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return sorted(times)[len(times) // 2]


def kernel_microbench(
    *, total_params: int, world_size: int, bucket_size: int, sparsities, device, repeats: int
) -> dict:
    """One rank's SCAPE kernels per step for a model of ``total_params`` in Megatron-like buckets
    (``bucket_size`` elements, padded to a multiple of lcm(W, 128)), W ranks, chunks of 100."""
    pad = math.lcm(world_size, 128)
    bucket = math.ceil(bucket_size / pad) * pad
    n_buckets = math.ceil(total_params / bucket)
    shard = bucket // world_size
    timer = Timer(device, repeats)
    gen = torch.Generator(device=device).manual_seed(0)
    moment = torch.randn(bucket, device=device, generator=gen)
    grad = torch.randn(bucket, device=device, generator=gen)
    out = {
        "total_params": total_params,
        "world_size": world_size,
        "bucket_elems": bucket,
        "buckets": n_buckets,
        "shard_elems": shard,
        "per_rank_owned_elems": n_buckets * shard,
    }
    # Dense reference: AdamS on the rank's whole ZeRO-1 shard (the dense baseline's update).
    own = torch.randn(n_buckets * shard, device=device, generator=gen)
    own_m, own_g = torch.zeros_like(own), torch.randn_like(own)
    out["dense_adams_update_s"] = timer(
        lambda: adams_update_(own, own_m, own_g, step=10, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)
    )
    for sparsity in sparsities:
        out[f"sparsity_{sparsity}"] = _time_kernels(
            timer, moment, grad, sparsity=sparsity, shard=shard, n_buckets=n_buckets,
            world_size=world_size,
        )  # fmt: skip
    return out


def _time_kernels(timer, moment, grad, *, sparsity, shard, n_buckets, world_size) -> dict:
    """The per-step kernels of one rank at one sparsity, over all its buckets."""
    device, bucket = moment.device, moment.numel()
    k = coefficients_per_chunk(sparsity, 100)
    basis = ShardBasis(shard, 100, k, device)
    masks = torch.stack(
        [basis.select(moment[j * shard : (j + 1) * shard]) for j in range(world_size)]
    )
    wire = pack(basis, moment, masks, world_size=world_size, value_dtype="bfloat16")
    target = torch.empty_like(moment)
    q = torch.empty(n_buckets * bucket, device=device)
    v, params = torch.ones_like(q), torch.randn_like(q)

    def select():  # the owner: its own shard of every bucket
        for _ in range(n_buckets):
            owner_mask(basis, moment[:shard])

    def pack_all():
        for _ in range(n_buckets):
            pack(basis, accumulate(moment, grad, 0.999), masks, world_size=world_size,
                 value_dtype="bfloat16")  # fmt: skip

    def commit_all():
        for _ in range(n_buckets):
            commit_moment_(target, moment, basis, masks, wire, world_size=world_size)

    def decode_all():
        for b in range(n_buckets):
            q[b * bucket : (b + 1) * bucket] = decode(basis, masks, wire, world_size)

    return {
        "k_per_chunk": k,
        "selected_per_shard": basis.num_selected,
        "select_s": timer(select),
        "pack_s": timer(pack_all),
        "commit_s": timer(commit_all),
        "decode_s": timer(decode_all),
        "rms_update_all_entries_s": timer(
            lambda: rms_update_(params, v, q, step=10, lr=1e-4, beta=0.95, eps=1e-8)
        ),
    }


def time_steps(rank: int, world_size: int, *, shape: str, sparsity: float | None, steps: int,
               warmup: int, batch: int, bucket_size: int | None, bf16: bool) -> dict:  # fmt: skip
    """Rank 0's median and mean step wall time of dense AdamS (``sparsity`` None) or SCAPE
    through Megatron (gloo on CPU, NCCL on GPUs): synthetic tokens, Megatron's overlap of
    gradient reduce-scatters with backward and of parameter all-gathers with the next
    forward, the first ``warmup`` steps not timed; SCAPE's bytes per rank per step."""
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


def megatron_steps(
    *, shape: str, steps: int, warmup: int, batch: int, sparsities, cpu: bool
) -> list:
    from scape.spawn import run_distributed

    results = []
    for sparsity in [None, *sparsities]:  # None: dense AdamS
        (res,) = run_distributed(
            time_steps,
            1,
            backend="gloo" if cpu else "nccl",
            timeout_s=300,
            shape=shape,
            sparsity=sparsity,
            steps=steps,
            warmup=warmup,
            batch=batch,
            bucket_size=None,
            bf16=not cpu,
        )
        print(json.dumps(res), flush=True)
        results.append(res)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--cpu-smoke", action="store_true", help="toy sizes on the CPU (tests the script)"
    )
    p.add_argument("--out-dir", default=str(ROOT / "results" / "gpu"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpu_check: SKIPPED - no CUDA device visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing written.")  # fmt: skip
        return 0
    started = time.perf_counter()
    report = {"environment": environment(), "status": "running"}
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

    # First, the SCAPE adapter through megatron-core on this GPU (scripts/gpu_adapter_check.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_adapter_check import adapter_check

    report["adapter"] = adapter_check(smoke=args.cpu_smoke)
    save()
    if args.cpu_smoke:
        device = torch.device("cpu")
        report["megatron"] = megatron_steps(
            shape="tiny-gpt", steps=2, warmup=1, batch=2, sparsities=[0.9], cpu=True
        )
        report["kernels"] = kernel_microbench(
            total_params=200_000, world_size=32, bucket_size=40_000, sparsities=[0.9],
            device=device, repeats=2,
        )  # fmt: skip
    else:
        device = torch.device("cuda")
        report["megatron"] = megatron_steps(
            shape="gpt-345m", steps=8, warmup=2, batch=8, sparsities=[0.9, 0.99], cpu=False
        )
        # Megatron's default bucket size at W=32: max(4e7, 1e6 * W) elements.
        report["kernels"] = kernel_microbench(
            total_params=count_params(SHAPES["llama-1.8b"]), world_size=32,
            bucket_size=max(40_000_000, 1_000_000 * 32), sparsities=[0.9, 0.99],
            device=device, repeats=5,
        )  # fmt: skip
    report["status"] = "ok"
    save()
    print(f"gpu_check: wrote {path} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
