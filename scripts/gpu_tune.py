"""Choose scape.fused's launch configurations by measurement on one CUDA GPU (~2 minutes).

At one rank's shapes of Llama-1.8B for W=32 (45 buckets of 40M entries, shards of 1.25M,
chunks of 100, the configs' bf16 wire), each part of the fused step is timed (CUDA events,
median of 3 after a warm-up) under each candidate configuration, next to one fp32 copy pass
over the same entries:

* ``pack`` and ``finish`` over every bucket: chunk rows per program x warps;
* ``select`` over the rank's owned shards: the DCT by cuBLAS (fp32) and a top-k kernel (rows x
  warps), or in registers by ``tl.dot`` (fp32 emulated by three TF32 products, or "ieee"),
  and the same at W=1 (the whole bucket owned);
* the elementwise kernels (fused AdamS) over the rank's shard: entries per program x warps.

Writes ``gpu_tune_<gpu>_<utc date>.json`` with every timing and each part's fastest
configuration; ``scape/fused.py``'s ``TUNING`` is set from it by hand (and says which file).
Without CUDA: SKIPPED. ``--smoke``: toy sizes on the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import Timer, _copy_pass, environment, step_state  # noqa: E402

from scape import fused  # noqa: E402
from scape.config import ScapeConfig  # noqa: E402
from scape.step import Geometry, Update, make_bucket_step  # noqa: E402

ROW_CONFIGS = [(rows, warps) for rows in (4, 8, 16, 32) for warps in (4, 8)]
ELEMENTWISE_CONFIGS = [(block, warps) for block in (1024, 2048, 4096) for warps in (4, 8)]
SELECT_METHODS = [("gemm", None, rows, 4) for rows in (8, 16, 32)] + [
    ("dot", "tf32x3", 32, 4), ("dot", "tf32x3", 32, 8), ("dot", "ieee", 32, 8)]  # fmt: skip


def _attempt(fn) -> float | str:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - a configuration that fails is reported
        return f"{type(err).__name__}: {str(err)[:300]}"


def _best(results: dict) -> str | None:
    timed = {k: v for k, v in results.items() if isinstance(v, float)}
    return min(timed, key=timed.get) if timed else None


def _sweep_select(timer, fn) -> dict:
    """``fn`` (a select) timed under every select method and top-k configuration."""
    timings = {}
    for method, precision, rows, warps in SELECT_METHODS:
        fused.TUNING["select"] = {"method": method, "precision": precision or "ieee"}
        fused.TUNING["topk"] = {"ROWS": rows, "num_warps": warps}
        name = method + (f",{precision}" if precision else f",ROWS={rows}") + f",num_warps={warps}"
        timings[name] = _attempt(lambda: timer(fn))
    fused.TUNING["select"] = {"method": "gemm", "precision": "ieee"}
    fused.TUNING["topk"] = {"ROWS": 16, "num_warps": 4}
    return timings


def tune(*, buckets: int, bucket: int, world_size: int, repeats: int, device) -> dict:
    timer = Timer(device, repeats)
    shard = bucket // world_size
    numel = buckets * bucket
    moment, grad, param, second, param_out = step_state(numel, device)
    out = {"buckets": buckets, "bucket_elems": bucket, "world_size": world_size,
           "floor_copy_pass_s": _copy_pass(timer, moment)}  # fmt: skip
    spans = [slice(b * bucket, (b + 1) * bucket) for b in range(buckets)]
    clip = torch.ones(1, device=device)
    for sparsity in (0.99, 0.9):
        cfg = ScapeConfig.for_sparsity(sparsity, value_dtype="bfloat16")
        step = make_bucket_step("fused", Geometry(shard, world_size, cfg.chunk, cfg.k), 0, cfg,
                                device, [(0, bucket)], 1e-8)  # fmt: skip
        masks = torch.randint(0, cfg.chunk, (world_size, step.num_selected), device=device)
        masks = masks.sort(dim=1).values  # any valid offsets: the timing does not read them
        payload = torch.zeros(step.payload_numel(False), dtype=step.wire_dtype, device=device)
        mask_out = torch.empty(step.num_selected, dtype=torch.uint8, device=device)

        def pack_all(step=step, masks=masks, payload=payload):
            for span in spans:
                step.pack(moment[span], grad[span], masks, payload)

        def finish_all(step=step, masks=masks, payload=payload):
            for span in spans:
                update = Update(param=param[span], second_moment=second[span],
                                param_out=param_out[span], decay_factor=1 - 1e-5, lr=1e-4,
                                step=10, clip=clip)  # fmt: skip
                step.finish(moment[span], grad[span], masks, payload[:-1], update=update,
                            next_mask=None)  # fmt: skip

        def select_all(step=step, mask_out=mask_out):
            for span in spans:
                step._select(moment[span], None, mask_out)

        row = {}
        for part, fn in (("pack", pack_all), ("finish", finish_all)):
            timings = {}
            for rows, warps in ROW_CONFIGS:
                fused.TUNING[part] = {"ROWS": rows, "num_warps": warps}
                timings[f"ROWS={rows},num_warps={warps}"] = _attempt(lambda fn=fn: timer(fn))
            fused.TUNING[part] = {"ROWS": 16, "num_warps": 4}
            row[part] = {"timings_s": timings, "best": _best(timings)}
        timings = _sweep_select(timer, select_all)
        row["select"] = {"timings_s": timings, "best": _best(timings)}
        # the select at W=1: one whole bucket owned (a model's every entry, bucket by bucket)
        whole = make_bucket_step("fused", Geometry(bucket, 1, cfg.chunk, cfg.k), 0, cfg, device,
                                 [(0, bucket)], 1e-8)  # fmt: skip
        whole_out = torch.empty(whole.num_selected, dtype=torch.uint8, device=device)
        timings = _sweep_select(
            timer, lambda whole=whole, out=whole_out: whole._select(moment[spans[0]], None, out)
        )
        row["select_one_bucket_at_w1"] = {"timings_s": timings, "best": _best(timings)}
        out[f"sparsity_{sparsity}"] = row
    owned = buckets * shard
    p, m, g = param[:owned], moment[:owned], grad[:owned]
    timings = {}
    for block, warps in ELEMENTWISE_CONFIGS:
        fused.TUNING["elementwise"] = {"BLOCK": block, "num_warps": warps}
        timings[f"BLOCK={block},num_warps={warps}"] = _attempt(lambda: timer(lambda: fused.adams_fused_(
            p, m, g, step=10, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)))  # fmt: skip
    out["elementwise_adams_shard"] = {"timings_s": timings, "best": _best(timings)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (interpreter)")
    p.add_argument("--out-dir", default=str(ROOT / "results" / "gpu"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_tune: SKIPPED - no CUDA device visible to torch; nothing written.")
        return 0
    started = time.perf_counter()
    report = {"environment": environment()}
    if args.smoke:
        report["tuning"] = tune(buckets=2, bucket=2_000, world_size=4, repeats=1,
                                device=torch.device("cpu"))  # fmt: skip
    else:
        report["tuning"] = tune(buckets=45, bucket=40_000_000, world_size=32, repeats=3,
                                device=torch.device("cuda"))  # fmt: skip
    report["wall_s"] = time.perf_counter() - started
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", report["environment"]["gpu"] or "cpu-smoke").strip("-")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out_dir) / f"gpu_tune_{gpu}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_tune: wrote {out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
