"""`make bench-overhead`: SCAPE's optimizer-side work per step against a dense AdamS step.

One Megatron bucket as a rank sees it at Llama-1.8B scale (W=32, buckets of 40M), each part
timed alternately with the dense parts, medians; per step = per bucket x buckets; on the CPU,
and on a GPU when there is one. SCAPE's parts are :mod:`scape.shard`'s as the Megatron adapter
calls them; dense ZeRO-1's are Megatron's (scale the W*S grads, AdamS on the S owned entries).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.harness import cli, quiet
from benchmarks.harness.paper import PAPER_MODELS, SCAPE_STEP
from scape.adams import adams_update_
from scape.basis import ShardBasis
from scape.config import ScapeConfig
from scape.shard import accumulate, commit_moment_, decay_runs, owner_mask, pack, step_bucket_

__all__ = ["main", "measure"]
VALUE_DTYPE = "bfloat16"  # on the wire, as the projection assumes
LR, WD = 1e-4, 0.1


def measure(world: int, shard: int, sparsity: float, repeats: int,
            device: torch.device) -> dict:  # fmt: skip
    """Median seconds of every SCAPE part and every dense part, for one bucket."""
    g = torch.Generator().manual_seed(0)
    cfg = ScapeConfig.for_sparsity(sparsity)
    basis = ShardBasis(shard, cfg.chunk, cfg.k, device)
    n = world * shard

    def rand(size: int) -> torch.Tensor:
        return torch.randn(size, generator=g).to(device)

    moment, grad, params = rand(n), rand(n), rand(n)
    second = rand(n).abs_()
    # Weight decay applies to whole params (matrices: almost everything), so to a few
    # contiguous runs of the bucket; here 1% of it, in the middle, is left undecayed.
    decay_mask = torch.ones(n, dtype=torch.bool, device=device)
    decay_mask[n // 2 : n // 2 + n // 100] = False
    runs = decay_runs(decay_mask)
    masks = torch.stack([basis.select(moment[j * shard : (j + 1) * shard]) for j in range(world)])
    main, exp_avg = rand(shard), rand(shard)
    held: dict[str, torch.Tensor] = {}  # outputs one part hands the next
    target = torch.empty_like(moment)  # commit writes here, so repeats read the same moment

    def dense_update() -> None:
        # As Megatron's distributed optimizer: shard grads -> fp32 main grads, the update,
        # main params -> the model's param buffer (the all-gather then fills it in place).
        adams_update_(main, exp_avg, grad[:shard].float(), step=10, lr=LR, beta1=0.9, beta2=0.95,
                      eps=1e-8, weight_decay=WD)  # fmt: skip
        params[:shard].copy_(main)

    parts: dict[str, Callable[[], object]] = {
        "scape.select": lambda: owner_mask(basis, moment[:shard]),
        "scape.accumulate": lambda: held.update(cand=accumulate(moment, grad, cfg.moment_beta)),
        "scape.pack": lambda: held.update(wire=pack(basis, held["cand"], masks, world_size=world,
                                                    value_dtype=VALUE_DTYPE)),
        "scape.commit": lambda: commit_moment_(target, held["cand"], basis, masks, held["wire"],
                                               world_size=world),
        # the step's summed buffer has the wire's shape and dtype
        "scape.step": lambda: step_bucket_(params, second, basis, masks, held["wire"],
                                           world_size=world, decay=runs, decay_factor=1.0 - LR * WD,
                                           update="rms", step=10, lr=LR,
                                           beta=cfg.second_moment_beta, eps=1e-8),
        # DDP's in-place pre-scaling of all W*S grads (by 1 here: the same cost, and repeated
        # calls do not drift the values towards denormals)
        "dense.scale": lambda: grad.mul_(1.0),
        "dense.update": dense_update,
    }  # fmt: skip
    for fn in parts.values():  # warm-up, in step order
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    times: dict[str, list[float]] = {p: [] for p in parts}
    for _ in range(repeats):  # alternate, so drift on a shared machine hits both alike
        for p, fn in parts.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[p].append(time.perf_counter() - start)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    scape_total = sum(v for n_, v in med.items() if n_.startswith("scape."))
    dense_total = sum(v for n_, v in med.items() if n_.startswith("dense."))
    return {"selected_per_shard": basis.num_selected, "median_s": med,
            "scape_total_s": scape_total, "dense_total_s": dense_total,
            "scape_over_dense_total": scape_total / dense_total}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, Path("results/bench/overhead.json"))
    parser.add_argument("--world-size", type=int, default=32)
    parser.add_argument("--bucket", type=int, default=40_000_000, help="elements per bucket")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    protocol = cli.start("bench-overhead", args)
    torch.set_num_threads(1)
    from scape.megatron.models import SHAPES, count_params

    shard = args.bucket // args.world_size
    buckets = {m: -(-count_params(SHAPES[m]) // args.bucket) for m in PAPER_MODELS}
    report: dict = {"scape_step": SCAPE_STEP, "commit": quiet.commit(), "world_size": args.world_size,
                    "bucket": args.bucket, "shard": shard, "buckets_per_model": buckets,
                    "value_dtype": VALUE_DTYPE, "devices": {},
                    "protocol": protocol.to_dict()}  # fmt: skip
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    else:
        report["gpu_skipped"] = "no CUDA device in this session: GPU overhead not measured"
        print(f"bench-overhead: GPU part SKIPPED ({report['gpu_skipped']})")
    for device in devices:
        per_sparsity = {}
        for label, sparsity in (("scape-90", 0.9), ("scape-99", 0.99)):
            print(f"== overhead: {device.type}, {label}, W={args.world_size}, S={shard}", flush=True)  # fmt: skip
            m = quiet.run_round(f"{device.type} {label}", lambda s=sparsity, d=device: measure(
                args.world_size, shard, s, args.repeats, d), protocol)  # fmt: skip
            m["per_step_s"] = {model: {"scape": b * m["scape_total_s"], "dense": b * m["dense_total_s"]}
                               for model, b in buckets.items()}  # fmt: skip
            per_sparsity[label] = m
            print(f"  SCAPE {m['scape_total_s'] * 1e3:.1f} ms vs dense {m['dense_total_s'] * 1e3:.1f} ms"
                  f" per bucket (x{m['scape_over_dense_total']:.2f})", flush=True)  # fmt: skip
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (1 thread)"
        report["devices"][device.type] = {"name": name, **per_sparsity}
    cli.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
