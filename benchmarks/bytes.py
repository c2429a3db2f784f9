"""`make bench-bytes`: bytes on the wire per rank per step, by kind, for every method.

Two parts, both written to ``results/bench/bytes.json``:

* **measured**: a 4-rank gloo run on loopback of the communicator-level workload
  (:mod:`benchmarks.workloads`, a small Llama on byte-level text), every method trained
  side by side; bytes are the communicator's counters per step (ring accounting). Masks in
  each fixed encoding and in the delta encoding, whose size depends on how many entries
  change, so it is read per step together with the measured overlap between consecutive
  masks.
* **paper scale**: the same accounting for GPT-345M, Llama-500M and Llama-1.8B on W=32
  with Megatron's buckets (``benchmarks.core``), the delta encoding sized with the
  measured overlap.

Ratios: ``dense_over_this`` = dense ZeRO-1 bf16 bytes / this method's (how many times
less); ``this_over_value_limit`` = this method's bytes / its values alone (masks' cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import quiet
from benchmarks.core import megatron_buckets
from benchmarks.launch import launch_ranks
from scape.comm import ring_bytes_per_rank
from scape.encoding import FIXED_ENCODINGS, delta_nbytes, encoded_nbytes, resolve_encoding
from scape.masks import num_selected

__all__ = ["MEASURED_METHODS", "paper_scale_bytes", "summarize_measured"]

MODEL = {"layers": 2, "hidden": 256, "heads": 4, "ffn": 704, "seq": 32, "batch": 1}
ENCODINGS = (*FIXED_ENCODINGS, "auto", "delta")
MEASURED_METHODS = [
    {"name": "dense-adamw", "optimizer": "adamw"},
    {"name": "dense-adams"},
    {"name": "dense-adams-fp32", "wire": "float32"},
    *[
        {"name": f"scape-{s}-{enc}", "density": d, "encoding": enc}
        for s, d in (("90", 0.1), ("99", 0.01))
        for enc in ENCODINGS
    ],
]
# The same contenders through Megatron's train step (the adapter has no delta encoding).
MEGATRON_METHODS = [
    {"name": "dense-adamw", "optimizer": "adamw"},
    {"name": "dense-adams"},
    *[
        {"name": f"scape-{s}-{enc}", "density": d, "encoding": enc}
        for s, d in (("90", 0.1), ("99", 0.01))
        for enc in FIXED_ENCODINGS
    ],
]
PAPER_MODELS = ("gpt-345m", "llama-500m", "llama-1.8b")
BF16 = 2
VALUE_KINDS = ("grad_values", "param_values")


def _ratios(entry: dict[str, float], dense_total: float) -> dict[str, float]:
    values = sum(entry.get(k, 0.0) for k in VALUE_KINDS)
    total = sum(entry.get(k, 0.0) for k in (*VALUE_KINDS, "masks"))
    return {"total": total, "dense_over_this": dense_total / total,
            "this_over_value_limit": total / values}  # fmt: skip


def summarize_measured(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median bytes per rank per step (rank 0's counters; all ranks count alike) and overlaps."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for row in results[0]["steps"]:
        if row["measured"]:
            by_method.setdefault(row["method"], []).append(row)
    # Overlap of consecutive masks: per step, the mean over ranks (each rank owns a shard).
    overlap_by_step: dict[tuple[str, int], list[float]] = {}
    for res in results:
        for row in res["steps"]:
            if row["mask_overlap"] is not None:
                overlap_by_step.setdefault((row["method"], row["step"]), []).append(
                    row["mask_overlap"]
                )
    dense_total = None
    methods = {}
    for name, rows in by_method.items():
        kinds = sorted({k for r in rows for k in r["bytes"]})
        med = {k: statistics.median(r["bytes"].get(k, 0.0) for r in rows) for k in kinds}
        series = sorted(
            (step, statistics.mean(v)) for (m, step), v in overlap_by_step.items() if m == name
        )
        methods[name] = {"bytes_per_rank": med, "overlap_series": series}
        if name == "dense-adams":
            dense_total = sum(med.get(k, 0.0) for k in VALUE_KINDS)
    for entry in methods.values():
        entry.update(_ratios(entry["bytes_per_rank"], dense_total))
        series = entry["overlap_series"]
        late = [o for _, o in series[len(series) // 2 :]]
        entry["mask_overlap_median_late"] = statistics.median(late) if late else None
    order = [m["name"] for m in MEASURED_METHODS]
    methods = dict(sorted(methods.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                          else len(order)))  # fmt: skip
    return {"world_size": len(results), "n_params": results[0]["n_params"],
            "shard_size": results[0]["shard_size"], "methods": methods}  # fmt: skip


def _is_paper_scape(variant: dict[str, Any]) -> bool:
    """The paper's SCAPE: |m| statistic, delayed mask, error feedback, frozen m, no age term."""
    return (variant.get("method") == "scape" and variant.get("statistic") == "momentum"
            and variant.get("delay_mask", True) and variant.get("error_feedback", True)
            and variant.get("off_mask_momentum", "freeze") == "freeze"
            and variant.get("age_weight", 0.0) == 0.0)  # fmt: skip


def quality_study_overlap(root: Path = Path("results/quality")) -> dict[str, Any]:
    """Overlap of consecutive masks from the quality study's runs (issue 7), if present.

    Those runs train for hundreds to thousands of steps (the runs here, a few dozen), so
    their late-training overlap is the better estimate for sizing the delta at scale. Per
    density: the longest run of the paper's SCAPE; median over its second half. Every
    other SCAPE variant's overlap is listed under ``variants`` (an age term, for one,
    rotates the mask on purpose, and the delta then buys nothing).
    """
    best: dict[str, Any] = {}
    variants: dict[str, float] = {}
    for path in sorted(root.glob("**/runs/*.jsonl")):
        try:
            lines = path.read_text().splitlines()
            header = json.loads(lines[0])
            variant = header["settings"]["variant"]
            series = [r["mask_overlap"] for r in map(json.loads, lines[1:])
                      if r.get("mask_overlap") is not None]  # fmt: skip
        except (OSError, ValueError, KeyError, IndexError):
            continue
        if variant.get("method") != "scape" or not series:
            continue
        late = statistics.median(series[len(series) // 2 :])
        variants[f"{path.parent.parent.name}/{header.get('run_id', path.stem)}"] = late
        key = str(variant["density"])
        if _is_paper_scape(variant) and len(series) > best.get(key, {}).get("steps", 0):
            best[key] = {"overlap": late, "steps": len(series), "file": str(path),
                         "model": header.get("model")}  # fmt: skip
    return {**best, "variants": variants} if best or variants else {}


def megatron_measured(world_size: int, rounds: int) -> dict[str, Any]:
    """Bytes per rank per step read from real multi-rank Megatron runs (loopback gloo)."""
    from benchmarks.megatron_workload import scape_adapter_available

    methods = MEGATRON_METHODS
    note = "dense through Megatron DDP + DistributedOptimizer; SCAPE through scape.megatron"
    if not scape_adapter_available():
        methods = [m for m in methods if m["name"].startswith("dense")]
        note = "SCAPE adapter (scape.megatron.optimizer) not present: dense methods only"
    spec = {"workload": "megatron", "model": MODEL, "methods": methods, "warmup": 2,
            "rounds": rounds, "reduce_scatter": "ring"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="scape-bytes-mg-") as tmp:
        results = launch_ranks("benchmarks.rank_main", spec, Path(tmp), world_size=world_size,
                               timeout_s=900)  # fmt: skip
    out: dict[str, Any] = {"world_size": world_size, "n_params": results[0]["n_params"],
                           "padded": results[0]["padded"], "note": note, "methods": {}}  # fmt: skip
    for name in [m["name"] for m in methods]:
        rows = [r for r in results[0]["steps"] if r["method"] == name and r["measured"]]
        kinds = sorted({k for r in rows for k in r["bytes"]})
        out["methods"][name] = {
            k: statistics.median(r["bytes"].get(k, 0.0) for r in rows) for k in kinds
        }
    return out


def paper_scale_bytes(n_params: int, world_size: int, overlap: dict[float, float]) -> dict:
    """Per-rank bytes per step at scale, bf16 values; ``overlap[density]`` sizes the delta."""
    buckets = megatron_buckets(n_params, world_size)
    dense = ring_bytes_per_rank(sum(buckets) * BF16, world_size)
    out: dict[str, dict[str, float]] = {
        "dense-adamw": {"grad_values": dense, "param_values": dense},
        "dense-adams": {"grad_values": dense, "param_values": dense},
    }
    for label, density in (("90", 0.1), ("99", 0.01)):
        shards = [b // world_size for b in buckets]
        ks = [num_selected(s, density) for s in shards]
        values = sum(ring_bytes_per_rank(world_size * k * BF16, world_size) for k in ks)
        for enc in ENCODINGS:
            if enc == "delta":
                # Lengths (int32 per rank) then payloads padded to the largest; here all
                # shards are assumed to change the same fraction, 1 - measured overlap.
                per_shard = [
                    delta_nbytes(s, k, round((1.0 - overlap[density]) * k)) + 4
                    for s, k in zip(shards, ks, strict=True)
                ]
            else:
                per_shard = [encoded_nbytes(s, k, enc) for s, k in zip(shards, ks, strict=True)]
            masks = sum(ring_bytes_per_rank(world_size * b, world_size) for b in per_shard)
            name = f"scape-{label}-{enc}"
            if enc == "auto":
                name += f"({resolve_encoding('auto', shards[0], ks[0])})"
            out[name] = {"grad_values": values, "param_values": values, "masks": masks}
    dense_total = 2 * dense
    return {
        "n_params": n_params,
        "world_size": world_size,
        "buckets": len(buckets),
        "methods": {n: {"bytes_per_rank": e, **_ratios(e, dense_total)} for n, e in out.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--megatron-rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/bench/bytes.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    protocol = quiet.protocol_from_args(args)
    quiet.require_quiet("bench-bytes", protocol.allow_busy)
    load_before = quiet.load_average()
    spec = {"model": MODEL, "methods": MEASURED_METHODS, "warmup": args.warmup,
            "rounds": args.rounds, "reduce_scatter": "ring"}  # fmt: skip
    print(f"== bytes: {args.world_size} gloo ranks on loopback, {len(MEASURED_METHODS)} methods")
    with tempfile.TemporaryDirectory(prefix="scape-bytes-") as tmp:
        results = launch_ranks("benchmarks.rank_main", spec, Path(tmp),
                               world_size=args.world_size, timeout_s=900)  # fmt: skip
    measured = summarize_measured(results)
    overlap = {
        d: measured["methods"][f"scape-{s}-delta"]["mask_overlap_median_late"]
        for s, d in (("90", 0.1), ("99", 0.01))
    }
    quality = quality_study_overlap()
    source = {str(d): f"measured here ({args.rounds} rounds)" for d in overlap}
    for d in list(overlap):
        if str(d) in quality:  # the longer run's overlap is the better guess at scale
            overlap[d] = quality[str(d)]["overlap"]
            source[str(d)] = (f"quality study, {quality[str(d)]['model']}, "
                              f"{quality[str(d)]['steps']} steps")  # fmt: skip
    report: dict[str, Any] = {"model": MODEL, "measured": measured,
                              "quality_study_overlap": quality,
                              "overlap_used_at_scale": overlap,
                              "overlap_source": source}  # fmt: skip
    print("== bytes: the same through Megatron's train step, 2 gloo ranks", flush=True)
    try:
        report["megatron"] = megatron_measured(2, args.megatron_rounds)
    except Exception as err:  # report and carry on: the other sections stand on their own
        report["megatron"] = {"error": f"{type(err).__name__}: {err}"[:2000]}
        print(f"  Megatron byte run FAILED: {report['megatron']['error'][:300]}")
    from scape.megatron.models import SHAPES, count_params

    paper = {
        name: paper_scale_bytes(count_params(SHAPES[name]), 32, overlap) for name in PAPER_MODELS
    }
    report.update(paper_scale=paper)
    # Byte counts do not depend on load; recorded as every benchmark records it.
    report["quiet"] = {"load_before": load_before, "load_after": quiet.load_average(),
                       "note": "counts only: not re-run under load"}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for name, m in measured["methods"].items():
        print(f"  {name:22s} {m['total'] / 1e3:9.1f} kB/rank/step  dense/this {m['dense_over_this']:6.1f}"
              f"  this/values {m['this_over_value_limit']:.2f}")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
