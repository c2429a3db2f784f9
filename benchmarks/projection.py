"""`make bench-project`: the cost model projected to the paper's cluster, 32 GH200 nodes.

Every input not measured here is an :class:`Assumptions` field (written into projection.json);
bytes from :mod:`benchmarks.harness.paper`; compute = 6 N T + 12 L h s T FLOPs at peak x MFU;
optimizer work from the memory-traffic model; both calibrated by the GPU check when
``results/gpu/gpu_check_*.json`` has one; no overlap and full overlap as the two bounds.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.harness import cli, paper
from scape.comm import GRAD_VALUES, MASKS, PARAM_VALUES

__all__ = ["SPARSITIES", "Assumptions", "calibrated", "comm_seconds", "gpu_calibration",
           "project_model"]  # fmt: skip

PAPER = {"speedup_llama_1_8b": 3.26, "wallclock_saving_llama_500m": 0.433}
SPARSITIES = {"scape-90": 0.9, "scape-99": 0.99}


@dataclass(frozen=True)
class Assumptions:
    world_size: int = 32
    link_gbit: float = 400.0
    link_efficiency: float = 0.8
    alpha_us: float = 10.0
    peak_tflops: float = 989.0
    mfu: float = 0.40
    tokens_per_gpu: int = 16_384
    hbm_Bps: float = 4.0e12
    hbm_efficiency: float = 0.6
    scape_value_bytes: int = 2

    @property
    def alpha_s(self) -> float:
        return self.alpha_us * 1e-6

    @property
    def bandwidth_Bps(self) -> float:
        """Bytes per second one rank sends in a ring."""
        return self.link_gbit * 1e9 / 8 * self.link_efficiency


def _flops(shape, tokens: int, n_params: int) -> float:
    attention = 12.0 * shape.num_layers * shape.hidden_size * shape.seq_length * tokens
    return 6.0 * n_params * tokens + attention


def gpu_calibration(root: Path = Path("results/gpu")) -> dict | None:
    """The newest GPU check's calibration, or None when there is none. mfu: FLOPs of its dense
    AdamS GPT-345M step (W=1; its tokens per step; SDPA attention since the fused-step check)
    / (median step x peak); kernels: per-step seconds of one rank of W=32 at Llama-1.8B
    (``buckets`` buckets): SCAPE's whole step per sparsity and dense AdamS's shard update
    (checks before the fused step: the sum of the timed parts, the foreach update)."""
    from scape.megatron.models import SHAPES

    files = sorted(root.glob("gpu_check_*.json"))
    report = json.loads(files[-1].read_text()) if files else {}
    if report.get("status") != "ok" or not report["environment"].get("gpu"):
        return None  # no finished GPU run (``--cpu-smoke`` tests the script, on the CPU)
    dense = next(r for r in report["megatron"] if r["method"] in ("adams", "dense"))
    shape = SHAPES[dense["shape"]]
    tokens = dense.get("tokens_per_step", 8 * shape.seq_length)
    flops = _flops(shape, tokens, dense["params"])
    k = report["kernels"]
    kernels = {"dense": k.get("dense_adams_fused_shard_s", k.get("dense_adams_update_s"))}
    for label, sparsity in SPARSITIES.items():
        row = k[f"sparsity_{sparsity}"]
        kernels[label] = row["step_s"] if "step_s" in row else (
            row["select_s"] + row["pack_s"] + row["commit_s"] + row["decode_s"]
            + row["rms_update_all_entries_s"])  # fmt: skip
    return {"file": str(files[-1]), "gpu": report["environment"].get("gpu"),
            "mfu": flops / (dense["median_step_s"] * Assumptions().peak_tflops * 1e12),
            "mfu_tokens_per_step": tokens, "buckets": k["buckets"], "kernels": kernels}  # fmt: skip


def calibrated(root: Path = Path("results/gpu")) -> tuple[Assumptions, dict | None]:
    """The assumptions with the GPU check's MFU, and its calibration, when there is one."""
    cal = gpu_calibration(root)
    return (Assumptions() if cal is None else replace(Assumptions(), mfu=cal["mfu"])), cal


@functools.lru_cache(maxsize=4096)  # the break-even map asks for each link many times
def comm_seconds(n_params: int, sparsity: float | None, a: Assumptions) -> dict[str, float]:
    """Exchange seconds per step (``sparsity`` None: dense), by part; each collective costs
    (W-1) alpha plus the bytes a rank sends in it over B (cached: do not modify the result)."""
    w = a.world_size
    calls = len(paper.megatron_buckets(n_params, w))  # per kind of value exchange: one per bucket
    if sparsity is None:
        sent = paper.dense_bytes(n_params, w)
    else:
        sent = paper.scape_bytes(n_params, w, sparsity, a.scape_value_bytes)

    def seconds(kind: str, n_calls: int) -> float:
        return n_calls * (w - 1) * a.alpha_s + sent[kind] / a.bandwidth_Bps if sent[kind] else 0.0

    return {"grad_sync": seconds(GRAD_VALUES, calls), "param_sync": seconds(PARAM_VALUES, calls),
            "mask": seconds(MASKS, 1)}  # fmt: skip


def project_model(name: str, a: Assumptions, tokens: int | None = None,
                  gpu_cal: dict | None = None) -> dict:  # fmt: skip
    """Projected step times of dense AdamS and SCAPE-90/99 for one model shape."""
    from scape.megatron.models import SHAPES, count_params

    shape = SHAPES[name]
    n = count_params(shape)
    tokens = tokens or a.tokens_per_gpu
    compute = _flops(shape, tokens, n) / (a.peak_tflops * 1e12 * a.mfu)
    opt = optimizer_seconds(n, a, gpu_cal)
    dense_comm = comm_seconds(n, None, a)
    dense_xfer = dense_comm["grad_sync"] + dense_comm["param_sync"]
    dense = {"no_overlap": compute + opt["dense"] + dense_xfer,
             "full_overlap": max(compute, dense_xfer) + opt["dense"]}  # fmt: skip
    out = {"n_params": n, "buckets": len(paper.megatron_buckets(n, a.world_size)),
           "tokens_per_gpu": tokens, "compute_s": compute, "dense_comm_s": dense_comm,
           "dense_optimizer_s": opt["dense"], "optimizer_source": opt["source"],
           "dense_step_s": dense, "scape": {}}  # fmt: skip
    for label, sparsity in SPARSITIES.items():
        comm = comm_seconds(n, sparsity, a)
        exposed_mask = max(0.0, comm["mask"] - compute)  # made a step ahead: hides behind it
        xfer = comm["grad_sync"] + comm["param_sync"]
        step = {"no_overlap": compute + opt[label] + xfer + exposed_mask,
                "full_overlap": max(compute, xfer) + opt[label] + exposed_mask}  # fmt: skip
        entry = {"comm_s": comm, "optimizer_s": opt[label], "step_s": step}
        for mode in ("no_overlap", "full_overlap"):
            entry[f"speedup_{mode}"] = dense[mode] / step[mode]
            entry[f"saving_{mode}"] = 1.0 - step[mode] / dense[mode]
        out["scape"][label] = entry
    return out


def optimizer_seconds(n_params: int, a: Assumptions, gpu_cal: dict | None = None) -> dict:
    """Per-step optimizer-side seconds on the GPU: the GPU check's kernels (measured at
    Llama-1.8B, scaled by buckets) plus what they do not time (dense: the gradient scaling)
    from the memory-traffic model; without a GPU check, the memory-traffic model alone."""
    w, bw = a.world_size, a.hbm_Bps * a.hbm_efficiency
    buckets = paper.megatron_buckets(n_params, w)
    out: dict = {"source": f"GPU check kernels ({gpu_cal['gpu']}) + modeled remainder" if gpu_cal
                 else f"modeled (memory traffic / ({a.hbm_Bps / 1e12:g} TB/s x {a.hbm_efficiency}))"}  # fmt: skip
    for label, sparsity in SPARSITIES.items():
        selected = paper.selected_per_shard([b // w for b in buckets], sparsity)
        traffic = [
            paper.traffic_bytes(w, b // w, s) for b, s in zip(buckets, selected, strict=True)
        ]
        if gpu_cal is None:
            out[label] = sum(sum(t["scape"].values()) for t in traffic) / bw
            out["dense"] = sum(sum(t["dense"].values()) for t in traffic) / bw
        else:  # weight decay rides in the update's pass (step_bucket_): no traffic of its own
            scale = len(buckets) / gpu_cal["buckets"]
            out[label] = scale * gpu_cal["kernels"][label]
            out["dense"] = scale * gpu_cal["kernels"]["dense"] + sum(
                t["dense"]["scale"] for t in traffic) / bw  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, timing=False)
    parser.add_argument("--bench-dir", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    a, cal = calibrated()
    models = {m: project_model(m, a, gpu_cal=cal) for m in paper.PAPER_MODELS}
    sweep = {
        m: {t: {lab: project_model(m, a, t, cal)["scape"][lab]["speedup_no_overlap"]
                for lab in SPARSITIES}
            for t in (1024, 2048, 4096, 8192, 16384, 32768)}
        for m in models
    }  # fmt: skip
    report = {"assumptions": asdict(a), "paper": PAPER, "models": models,
              "speedup_vs_tokens_per_gpu_no_overlap": sweep,
              "gpu_calibration": cal or "none: no results/gpu/gpu_check_*.json (no GPU run yet)",
              "optimizer_source": models["llama-1.8b"]["optimizer_source"]}  # fmt: skip
    for m, p in models.items():
        s99, dense = p["scape"]["scape-99"], p["dense_step_s"]
        print(f"  {m:11s} dense {dense['no_overlap'] * 1e3:6.1f} ms  SCAPE-99 "
              f"{s99['step_s']['no_overlap'] * 1e3:6.1f} ms  x{s99['speedup_no_overlap']:.2f}"
              f"  (both fully overlapped: x{s99['speedup_full_overlap']:.2f})")  # fmt: skip
    cli.write_json(args.bench_dir / "projection.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
