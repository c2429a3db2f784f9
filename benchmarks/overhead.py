"""`make bench-overhead`: SCAPE's optimizer-side work per step vs a dense AdamS step.

Measured on one Megatron bucket as a rank sees it at Llama-1.8B scale (W=32 ranks,
buckets of 40M elements, so a shard of S = 1.25M; every model has the same bucket shape,
only the number of buckets differs), every part timed alternately with the dense parts,
medians. Per step = per bucket x buckets. CPU here; on a GPU when ``torch.cuda`` has one
(skipped with a message otherwise). ``benchmarks.core`` times selection/packing alone;
this times *everything* SCAPE does beyond communicating:

SCAPE, per bucket on every rank: score and select the owner's next mask, encode it,
decode the W masks, pack the W*k values (residual + grad), commit the residual (adds the
fresh grad over all W*S entries), decay all W*S params (a scalar every rank applies
itself), masked AdamS on the k owned entries, age bookkeeping, scatter the W*k gathered
params. Dense ZeRO-1 as Megatron does it: scale the W*S grads in place, copy the S owned
grads to fp32 main grads, AdamS, copy the S main params into the param buffer (the
all-gather writes the buffer in place, so there is nothing to unpack).

It also writes a memory-traffic estimate of each part (bytes read+written): the
``gpu_model`` section turns that into GPU time at an assumed HBM bandwidth. That is a
model, not a measurement, and is labelled so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks import quiet
from scape.adams import adams_update_, apply_weight_decay_
from scape.comm import bucket_positions
from scape.encoding import decode_mask, encode_mask, encoded_nbytes, resolve_encoding
from scape.masks import mask_generator, mask_scores, num_selected, select_mask
from scape.shard import commit_residual_, owner_update_, pack_values

__all__ = ["measure", "traffic_bytes"]

GH200_HBM_BPS = 4.0e12  # GH200 96 GB HBM3, ~4 TB/s (reference doc)
HBM_EFFICIENCY = 0.6  # assumed: gathers/scatters and top-k run below streaming bandwidth
TOPK_PASSES = 4  # assumed: a radix select reads the scores about this many times


def traffic_bytes(world: int, shard: int, k: int) -> dict[str, dict[str, float]]:
    """Bytes each part reads+writes (fp32 buffers, bf16 wire, int64 indices)."""
    n, wk = world * shard, world * k
    return {
        "scape": {
            "select": 4 * shard * 2 + 4 * shard * TOPK_PASSES,  # |m| -> scores, selection
            "encode_decode": 8 * k + 8 * wk,
            "pack": wk * (8 + 4 + 4 + 2),  # positions, residual, grad -> bf16
            "commit": 12 * n + wk * 12,  # residual += grad; residual[pos] -= sent
            "decay": 8 * n + 8 * shard,
            "update": k * (8 + 4 * 2 * 2 + 4),  # gather/scatter param, m; grad
            "age": 8 * shard + 12 * k,
            "unpack": wk * (8 + 2 + 4),
        },
        "dense": {"scale": 8 * n, "update": shard * (4 * 2 * 2 + 4 + 16)},
    }


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(world: int, shard: int, density: float, repeats: int, device: torch.device,
            selection: str = "sampled_threshold") -> dict:  # fmt: skip
    """Median seconds of every SCAPE part and every dense part, for one bucket."""
    g = torch.Generator().manual_seed(0)
    n, k = world * shard, num_selected(shard, density)

    def rand(size: int) -> torch.Tensor:
        return torch.randn(size, generator=g).to(device)

    residual, grad, params = rand(n), rand(n), rand(n)
    main, exp_avg = rand(shard), rand(shard)
    age = torch.zeros(shard, dtype=torch.int32, device=device)
    enc = resolve_encoding("auto", shard, k)
    masks = [torch.randperm(shard, generator=g)[:k].sort().values.to(device) for _ in range(world)]
    positions = bucket_positions(masks, shard)
    payloads = [encode_mask(m, shard, enc) for m in masks]
    synced = rand(k)
    gathered_sparse = rand(world * k).to(torch.bfloat16)
    hp = dict(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)

    def select() -> None:
        gen = mask_generator(0, 1, 0)
        scores = mask_scores("momentum", exp_avg=exp_avg)
        select_mask(scores, k, selection=selection, generator=gen)

    packed_holder: list[torch.Tensor] = []

    def pack() -> None:
        packed_holder[:] = [pack_values(residual, grad, positions, world_size=world,
                                        value_dtype="bfloat16")]  # fmt: skip

    scape_parts: dict[str, Callable[[], object]] = {
        "select": select,
        "encode_decode": lambda: (
            encode_mask(masks[0], shard, enc),
            [decode_mask(p, shard, k, enc) for p in payloads],
        ),
        "pack": pack,
        "commit": lambda: commit_residual_(
            residual, grad, positions, packed_holder[0], world_size=world, error_feedback=True
        ),  # fmt: skip
        "decay": lambda: (
            apply_weight_decay_(params, lr=1e-4, weight_decay=0.1),
            apply_weight_decay_(main, lr=1e-4, weight_decay=0.1),
        ),  # fmt: skip
        "update": lambda: owner_update_(main, exp_avg, masks[0], synced, step=10, **hp),
        "age": lambda: (age.add_(1), age.__setitem__(masks[0], 0)),
        "unpack": lambda: params.__setitem__(positions, gathered_sparse.float()),
    }
    shard_slice = slice(0, shard)

    def dense_update() -> None:
        # As Megatron's distributed optimizer: shard grads -> fp32 main grads, the update,
        # main params -> the model's param buffer (the all-gather then fills it in place).
        main_grad = grad[shard_slice].float()
        adams_update_(main, exp_avg, main_grad, step=10, weight_decay=0.1, **hp)
        params[shard_slice].copy_(main)

    dense_parts: dict[str, Callable[[], object]] = {
        # DDP's in-place pre-scaling of all W*S grads (by 1 here: the same cost, and
        # repeated calls do not drift the values towards denormals)
        "scale": lambda: grad.mul_(1.0),
        "update": dense_update,
    }
    for fn in [*scape_parts.values(), *dense_parts.values()]:  # warm-up (and fills pack)
        fn()
    times: dict[str, list[float]] = {f"scape.{p}": [] for p in scape_parts}
    times.update({f"dense.{p}": [] for p in dense_parts})
    for _ in range(repeats):  # alternate, so drift on a shared machine hits both alike
        for p, fn in scape_parts.items():
            times[f"scape.{p}"].append(_timed(fn, device))
        for p, fn in dense_parts.items():
            times[f"dense.{p}"].append(_timed(fn, device))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    scape_total = sum(v for n_, v in med.items() if n_.startswith("scape."))
    dense_total = sum(v for n_, v in med.items() if n_.startswith("dense."))
    return {
        "k": k,
        "mask_encoding": enc,
        "mask_bytes": encoded_nbytes(shard, k, enc),
        "median_s": med,
        "scape_total_s": scape_total,
        "dense_total_s": dense_total,
        "dense_update_s": med["dense.update"],
        "scape_over_dense_total": scape_total / dense_total,
        "scape_over_dense_update": scape_total / med["dense.update"],
    }


def gpu_model(world: int, shard: int, k: int, buckets: int) -> dict[str, float]:
    """Modeled GPU seconds per step (memory-bound parts at an assumed HBM bandwidth)."""
    t = traffic_bytes(world, shard, k)
    bw = GH200_HBM_BPS * HBM_EFFICIENCY
    return {
        "assumed_hbm_Bps": GH200_HBM_BPS,
        "assumed_efficiency": HBM_EFFICIENCY,
        "scape_s_per_step": buckets * sum(t["scape"].values()) / bw,
        "dense_s_per_step": buckets * sum(t["dense"].values()) / bw,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=32)
    parser.add_argument("--bucket", type=int, default=40_000_000, help="elements per bucket")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench/overhead.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    protocol = quiet.protocol_from_args(args)
    quiet.require_quiet("bench-overhead", protocol.allow_busy)
    torch.set_num_threads(1)
    from scape.megatron.models import SHAPES, count_params

    shard = args.bucket // args.world_size
    buckets = {m: -(-count_params(SHAPES[m]) // args.bucket)
               for m in ("gpt-345m", "llama-500m", "llama-1.8b")}  # fmt: skip
    report: dict = {"world_size": args.world_size, "bucket": args.bucket, "shard": shard,
                    "buckets_per_model": buckets, "devices": {},
                    "protocol": protocol.to_dict()}  # fmt: skip
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    else:
        report["gpu_skipped"] = "no CUDA device in this session: GPU overhead not measured"
        print(f"bench-overhead: GPU part SKIPPED ({report['gpu_skipped']})")
    for device in devices:
        per_density = {}
        for label, density in (("scape-90", 0.1), ("scape-99", 0.01)):
            print(
                f"== overhead: {device.type}, {label}, W={args.world_size}, S={shard}", flush=True
            )
            m = quiet.run_round(
                f"{device.type} {label}",
                lambda density=density, device=device: measure(
                    args.world_size, shard, density, args.repeats, device
                ),
                protocol,
            )
            m["per_step_s"] = {model: {"scape": b * m["scape_total_s"], "dense": b * m["dense_total_s"]}
                               for model, b in buckets.items()}  # fmt: skip
            m["gpu_model"] = gpu_model(args.world_size, shard, m["k"], buckets["llama-1.8b"])
            per_density[label] = m
            print(f"  SCAPE {m['scape_total_s'] * 1e3:.1f} ms vs dense {m['dense_total_s'] * 1e3:.1f} ms"
                  f" per bucket (x{m['scape_over_dense_total']:.2f})", flush=True)  # fmt: skip
        report["devices"][device.type] = {"name": _device_name(device), **per_density}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} thread)"


if __name__ == "__main__":
    sys.exit(main())
