"""`make bench-project`: the cost model projected to the paper's cluster, 32 GH200 nodes.

Every input that is not measured here is an assumption, listed in :class:`Assumptions`
and written into ``results/bench/projection.json`` beside the numbers:

* network: one GPU per node, NDR InfiniBand at 400 Gbit/s per direction; NCCL rings reach
  about 80% of line rate on large messages, so B = 40 GB/s per rank; alpha = 10 us per
  ring step (IB latency plus NCCL protocol overhead; two-tier fat tree). One
  reduce-scatter and one all-gather per Megatron bucket (40M elements), SCAPE adding one
  mask all-gather per bucket;
* compute: forward+backward FLOPs = 6 N T + 12 L h s T (T tokens per GPU per step), on a
  Hopper GPU at 989 TFLOP/s bf16 peak with 40% MFU -- or, when the GPU check of the
  Megatron issue (``scripts/gpu_check.py``) has written ``results/gpu/gpu_check_*.json``,
  at the MFU its dense GPT-345M steps reached, with SCAPE's selection, encode/decode, pack
  and scatter kernels taken from its Llama-1.8B micro-benchmark;
* batch: 16,384 tokens per GPU per step (0.5M tokens globally, the GPT-2/nanoGPT recipe),
  the paper's batch being unknown; a sweep over tokens per GPU is written too;
* optimizer-side work: the memory-traffic model of :mod:`benchmarks.overhead` (GPU time =
  bytes / (4 TB/s x 0.6)); measured GPU numbers replace it when ``overhead.json`` has them;
* dense exchange: bf16 grads and params (ZeRO-1); two bounds, no overlap (as our emulated
  runs) and Megatron's full overlap (grad reduce-scatter behind backward, param all-gather
  behind forward: comm hidden up to the compute time);
* SCAPE: bf16 values, masks in the best fixed encoding, mask all-gather hidden.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.core import megatron_buckets
from benchmarks.costmodel import AlphaBeta, ring_time
from benchmarks.overhead import traffic_bytes
from scape.encoding import delta_nbytes, encoded_nbytes
from scape.masks import num_selected

__all__ = [
    "Assumptions",
    "comm_seconds",
    "gpu_calibration",
    "mask_bytes",
    "project_model",
    "speedup_at_tokens",
]

PAPER = {"speedup_llama_1_8b": 3.26, "wallclock_saving_llama_500m": 0.433}


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

    @property
    def link(self) -> AlphaBeta:
        return AlphaBeta(self.alpha_us * 1e-6, self.link_gbit * 1e9 / 8 * self.link_efficiency)


def _flops(shape, tokens: int, n_params: int) -> float:
    attention = 12.0 * shape.num_layers * shape.hidden_size * shape.seq_length * tokens
    return 6.0 * n_params * tokens + attention


def compute_seconds(shape, tokens: int, a: Assumptions) -> float:
    from scape.megatron.models import count_params

    return _flops(shape, tokens, count_params(shape)) / (a.peak_tflops * 1e12 * a.mfu)


def gpu_calibration(root: Path = Path("results/gpu")) -> dict | None:
    """The newest GPU check's numbers as calibration inputs, or None when there is none.

    mfu: FLOPs of its dense GPT-345M steps (8 sequences, W=1) / (median step x peak).
    kernels: per-step seconds at Llama-1.8B, W=32, of SCAPE's measured kernels (sampled-
    threshold selection, encode, decode of every rank's masks, pack, scatter) per density,
    and of the dense AdamS update of the rank's shard.
    """
    from scape.megatron.models import SHAPES

    files = sorted(root.glob("gpu_check_*.json"))
    report = json.loads(files[-1].read_text()) if files else {}
    if report.get("status") != "ok":
        return None
    dense = next(r for r in report["megatron"] if r["method"] == "dense")
    shape = SHAPES[dense["shape"]]
    flops = _flops(shape, 8 * shape.seq_length, dense["params"])
    kernels = {"dense": report["kernels"]["dense_adams_update_s"]}
    for label, density in (("scape-90", 0.1), ("scape-99", 0.01)):
        row = report["kernels"][f"density_{density}"]
        enc = "bitmap" if density >= 0.1 else "offset16"  # what ``auto`` picks at S = 1.25M
        kernels[label] = (row["select_sampled_threshold_s"] + row[f"encode_{enc}_s"]
                          + row[f"decode_{enc}_all_ranks_s"] + row["pack_s"]
                          + row["scatter_params_s"])  # fmt: skip
    return {"file": str(files[-1]), "gpu": report["environment"].get("gpu"),
            "mfu": flops / (dense["median_step_s"] * Assumptions().peak_tflops * 1e12),
            "kernels": kernels}  # fmt: skip


def mask_bytes(shard: int, k: int, encoding: str, overlap: float | None) -> int:
    """One shard's mask on the wire: a fixed encoding, or the delta (+ its 4-byte length)."""
    if encoding == "delta":
        return delta_nbytes(shard, k, round((1.0 - overlap) * k)) + 4
    return encoded_nbytes(shard, k, encoding)


def comm_seconds(n_params: int, density: float, a: Assumptions, encoding: str = "auto",
                 overlap: float | None = None) -> dict[str, float]:  # fmt: skip
    """Exchange time per step: per bucket one RS and one AG (+ a mask AG for SCAPE)."""
    return dict(_comm_seconds(n_params, density, a, encoding, overlap))


@functools.lru_cache(maxsize=4096)  # the break-even map asks for each link many times
def _comm_seconds(n_params: int, density: float, a: Assumptions, encoding: str,
                  overlap: float | None) -> dict[str, float]:  # fmt: skip
    w = a.world_size
    grad = param = mask = 0.0
    for b in megatron_buckets(n_params, w):
        shard = b // w
        k = num_selected(shard, density)
        grad += ring_time(w * k * 2, w, a.link)  # bf16 values, W shards of k
        param += ring_time(w * k * 2, w, a.link)
        if density < 1.0:
            mask += ring_time(w * mask_bytes(shard, k, encoding, overlap), w, a.link)
            if encoding == "delta":  # the lengths' all-gather: latency only
                mask += (w - 1) * a.link.alpha_s
    return {"grad_sync": grad, "param_sync": param, "mask": mask}


def project_model(name: str, overlaps: dict[float, float], overhead: dict, a: Assumptions,
                  tokens: int | None = None, gpu_cal: dict | None = None) -> dict:  # fmt: skip
    """Projected step times of dense AdamS and SCAPE-90/99 for one model shape.

    ``overlaps[density]``: measured overlap of consecutive masks, sizing the delta encoding.
    """
    from scape.megatron.models import SHAPES, count_params

    shape = SHAPES[name]
    n = count_params(shape)
    tokens = tokens or a.tokens_per_gpu
    compute = compute_seconds(shape, tokens, a)
    buckets = len(megatron_buckets(n, a.world_size))
    opt = _optimizer_seconds(overhead, buckets, gpu_cal)
    dense_comm = comm_seconds(n, 1.0, a)
    dense_xfer = dense_comm["grad_sync"] + dense_comm["param_sync"]
    dense = {"no_overlap": compute + opt["dense"] + dense_xfer,
             "full_overlap": max(compute, dense_xfer) + opt["dense"]}  # fmt: skip
    out = {"n_params": n, "buckets": buckets, "tokens_per_gpu": tokens, "compute_s": compute,
           "dense_comm_s": dense_comm, "dense_step_s": dense, "scape": {}}  # fmt: skip
    for label, density in (("scape-90", 0.1), ("scape-99", 0.01)):
        for encoding in ("auto", "delta"):
            overlap = overlaps.get(density) if encoding == "delta" else None
            if encoding == "delta" and overlap is None:
                continue
            comm = comm_seconds(n, density, a, encoding, overlap)
            exposed_mask = max(0.0, comm["mask"] - compute)  # the delayed mask hides
            xfer = comm["grad_sync"] + comm["param_sync"]
            step = {"no_overlap": compute + opt[label] + xfer + exposed_mask,
                    "full_overlap": max(compute, xfer) + opt[label] + exposed_mask}  # fmt: skip
            name = label if encoding == "auto" else f"{label}-delta"
            out["scape"][name] = {"comm_s": comm, "optimizer_s": opt[label], "step_s": step}
            for mode in ("no_overlap", "full_overlap"):
                out["scape"][name][f"speedup_{mode}"] = dense[mode] / step[mode]
                out["scape"][name][f"saving_{mode}"] = 1.0 - step[mode] / dense[mode]
    return out


def _optimizer_seconds(overhead: dict, buckets: int, gpu_cal: dict | None = None) -> dict:
    """Per-step optimizer-side seconds on the GPU: measured where we can, else modeled.

    Order of preference: ``overhead.json`` measured on a GPU; the GPU check's kernels
    (measured at Llama-1.8B, scaled by buckets) plus the parts it does not time (residual
    commit, decay of all entries, masked update, age) from the memory-traffic model; the
    memory-traffic model alone.
    """
    gpu = overhead.get("devices", {}).get("cuda")
    n18 = overhead["buckets_per_model"]["llama-1.8b"]
    out: dict = {}
    for label in ("scape-90", "scape-99"):
        if gpu:
            out[label] = buckets * gpu[label]["scape_total_s"]
            out["dense"] = buckets * gpu[label]["dense_total_s"]
            continue
        cpu = overhead["devices"]["cpu"][label]
        model = cpu["gpu_model"]
        if gpu_cal is not None:
            parts = traffic_bytes(overhead["world_size"], overhead["shard"], cpu["k"])["scape"]
            rest = sum(parts[p] for p in ("commit", "decay", "update", "age"))
            rest_s = rest / (model["assumed_hbm_Bps"] * model["assumed_efficiency"])
            out[label] = buckets * (gpu_cal["kernels"][label] / n18 + rest_s)
            out["dense"] = buckets * gpu_cal["kernels"]["dense"] / n18
        else:
            out[label] = buckets * model["scape_s_per_step"] / n18
            out["dense"] = buckets * model["dense_s_per_step"] / n18
    if gpu:
        out["source"] = "measured on GPU"
    elif gpu_cal is not None:
        out["source"] = f"GPU check kernels ({gpu_cal['gpu']}) + modeled remainder"
    else:
        out["source"] = "modeled (memory traffic / HBM bandwidth)"
    return out


def speedup_at_tokens(name: str, overlaps: dict[float, float], overhead: dict, a: Assumptions,
                      tokens: int, label: str = "scape-99") -> float:  # fmt: skip
    p = project_model(name, overlaps, overhead, a, tokens)
    return p["scape"][label]["speedup_no_overlap"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    bytes_report = json.loads((args.bench_dir / "bytes.json").read_text())
    overlaps = {float(d): o for d, o in bytes_report["overlap_used_at_scale"].items()}
    overhead = json.loads((args.bench_dir / "overhead.json").read_text())
    cal = gpu_calibration()
    a = Assumptions() if cal is None else replace(Assumptions(), mfu=cal["mfu"])
    models = {m: project_model(m, overlaps, overhead, a, gpu_cal=cal)
              for m in ("gpt-345m", "llama-500m", "llama-1.8b")}  # fmt: skip
    sweep = {
        m: {t: {lab: project_model(m, overlaps, overhead, a, t, cal)["scape"][lab]
                ["speedup_no_overlap"] for lab in ("scape-90", "scape-99")}
            for t in (1024, 2048, 4096, 8192, 16384, 32768)}
        for m in models
    }  # fmt: skip
    report = {"assumptions": asdict(a), "paper": PAPER, "models": models,
              "speedup_vs_tokens_per_gpu_no_overlap": sweep,
              "gpu_calibration": cal or "none: no results/gpu/gpu_check_*.json (no GPU run yet)",
              "optimizer_source": _optimizer_seconds(overhead, 1, cal)["source"]}  # fmt: skip
    out = args.bench_dir / "projection.json"
    out.write_text(json.dumps(report, indent=1))
    for m, p in models.items():
        s99, dense = p["scape"]["scape-99"], p["dense_step_s"]
        print(f"  {m:11s} dense {dense['no_overlap'] * 1e3:6.1f} ms  SCAPE-99 "
              f"{s99['step_s']['no_overlap'] * 1e3:6.1f} ms  x{s99['speedup_no_overlap']:.2f}"
              f"  (both fully overlapped: x{s99['speedup_full_overlap']:.2f})")  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
