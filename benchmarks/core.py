"""`make bench-core`: bytes per rank per step, and SCAPE's CPU overhead, for a flat model.

Bytes come from the same formulas the communicator counts with (ring collectives,
(W-1)/W of the payload per rank), for W simulated ranks and Megatron-style buckets.
Overhead is measured side by side in one run: per shard, the time of SCAPE's extra work
(scores + exact top-k selection + mask encoding + packing the bucket's W*k values) against
one dense AdamS update of the same shard, alternating, median of ``--repeats`` runs.

Prints one JSON object. Example: python -m benchmarks.core --params 354e6 --world-size 32
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from benchmarks import quiet
from scape.adams import adams_update_
from scape.comm import ring_bytes_per_rank
from scape.encoding import FIXED_ENCODINGS, encode_mask, encoded_nbytes, resolve_encoding
from scape.masks import mask_scores, num_selected, select_sampled_threshold, select_topk
from scape.shard import pack_values

DENSITIES = {"scape90": 0.10, "scape99": 0.01}
BF16 = 2  # bytes per value on the wire (grads and params), as in the reference doc's table


def megatron_buckets(n_params: int, world_size: int) -> list[int]:
    """Bucket sizes as Megatron's DDP makes them: max(40M, 1M * W) elements, padded to lcm(W, 128)."""
    bucket = max(40_000_000, 1_000_000 * world_size)
    pad = math.lcm(world_size, 128)
    sizes = [bucket] * (n_params // bucket)
    if n_params % bucket:
        sizes.append(n_params % bucket)
    return [math.ceil(s / pad) * pad for s in sizes]


def bytes_per_step(n_params: int, world_size: int) -> dict:
    buckets = megatron_buckets(n_params, world_size)
    total = sum(buckets)
    dense = 2 * ring_bytes_per_rank(total * BF16, world_size)  # reduce-scatter + all-gather
    out = {
        "dense_zero1_bf16": {
            "grad_values": dense / 2,
            "param_values": dense / 2,
            "masks": 0.0,
            "total": dense,
        }
    }
    for name, density in DENSITIES.items():
        ks = [num_selected(b // world_size, density) for b in buckets]
        values = sum(ring_bytes_per_rank(world_size * k * BF16, world_size) for k in ks)
        value_limit = 2 * values
        for enc in (*FIXED_ENCODINGS, "auto"):
            masks = sum(
                ring_bytes_per_rank(
                    world_size * encoded_nbytes(b // world_size, k, enc), world_size
                )
                for b, k in zip(buckets, ks, strict=True)
            )
            tot = value_limit + masks
            label = (
                enc
                if enc != "auto"
                else f"auto({resolve_encoding('auto', buckets[0] // world_size, ks[0])})"
            )
            out[f"{name}/{label}"] = {
                "grad_values": values,
                "param_values": values,
                "masks": masks,
                "total": tot,
                "dense_over_this": dense / tot,
                "this_over_value_limit": tot / value_limit,
            }
    return {"buckets": len(buckets), "padded_params": total, "per_rank_bytes": out}


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def overhead(shard_size: int, world_size: int, repeats: int) -> dict:
    """SCAPE's extra per-shard work vs one dense AdamS update, measured alternately.

    Selection needs the scores and the top-k; packing gathers W*k values of the bucket;
    the masked update itself is cheaper than the dense one and is not counted as extra.
    """
    gen = torch.Generator().manual_seed(0)
    param, exp_avg, grad = (torch.randn(shard_size, generator=gen) for _ in range(3))
    # Packing reads W*k entries of the whole bucket; a residual and a fresh grad buffer.
    residual = torch.randn(world_size * shard_size, generator=gen)
    bucket_grad = torch.randn(world_size * shard_size, generator=gen)
    result = {}
    for name, density in DENSITIES.items():
        k = num_selected(shard_size, density)
        enc = resolve_encoding("auto", shard_size, k)
        positions = torch.cat(
            [
                torch.randperm(shard_size, generator=gen)[:k].sort().values + j * shard_size
                for j in range(world_size)
            ]
        )

        threshold_gen = torch.Generator().manual_seed(1)
        parts = {
            "select_topk": lambda k=k: select_topk(mask_scores("momentum", exp_avg=exp_avg), k),
            "select_sampled_threshold": lambda k=k, threshold_gen=threshold_gen: (
                select_sampled_threshold(
                    mask_scores("momentum", exp_avg=exp_avg),
                    k,
                    sample_size=16384,
                    generator=threshold_gen,
                )
            ),
            "encode": lambda k=k, enc=enc, positions=positions: encode_mask(
                positions[:k], shard_size, enc
            ),
            "pack": lambda positions=positions: pack_values(
                residual, bucket_grad, positions, world_size=world_size, value_dtype="bfloat16"
            ),
        }

        def dense_work():
            adams_update_(
                param,
                exp_avg.clone(),
                grad,
                step=10,
                lr=1e-4,
                beta1=0.9,
                beta2=0.95,
                eps=1e-8,
                weight_decay=0.1,
            )

        times: dict[str, list[float]] = {name: [] for name in [*parts, "dense_adams"]}
        for fn in [*parts.values(), dense_work]:  # warm-up
            fn()
        for _ in range(repeats):  # alternate, so drift on a shared machine hits all alike
            for part, fn in parts.items():
                times[part].append(_time(fn))
            times["dense_adams"].append(_time(dense_work))
        med = {part: statistics.median(ts) for part, ts in times.items()}
        d = med["dense_adams"]
        extra_topk = med["select_topk"] + med["encode"] + med["pack"]
        extra_fast = med["select_sampled_threshold"] + med["encode"] + med["pack"]
        result[name] = {
            "k": k,
            "encoding": enc,
            "median_s": med,
            "ratio_to_dense_adams_topk": extra_topk / d,
            "ratio_to_dense_adams_sampled_threshold": extra_fast / d,
        }
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--params", type=float, default=354e6, help="model size N (default: GPT-345M)"
    )
    parser.add_argument("--world-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    protocol = quiet.protocol_from_args(args)
    quiet.require_quiet("bench-core", protocol.allow_busy)
    n, w = int(args.params), args.world_size
    if n < w or w < 1:
        parser.error(f"--params ({n}) must be >= --world-size ({w}) >= 1")
    report = {
        "params": n,
        "world_size": w,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    report.update(bytes_per_step(n, w))
    shard = megatron_buckets(n, w)[0] // w
    report["overhead_per_shard"] = quiet.run_round(
        "overhead", lambda: {"shard_size": shard, **overhead(shard, w, args.repeats)}, protocol
    )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
