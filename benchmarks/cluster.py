"""`make bench-cluster`: step times on an emulated bandwidth-limited cluster.

For each (ranks, link rate): build the namespaces (:mod:`benchmarks.netns`), start one
rank per namespace, time a sweep of bare collectives (the cost model's calibration),
then train dense AdamS and SCAPE-90/99 (mask exchange overlapped and not) side by side,
alternating step by step. Writes ``results/bench/cluster.json``: per method the median
step time (slowest rank per step), phases, bytes per rank per step, the speed-up over
dense (median of per-round ratios), and the cost model's prediction and its error.
Skips with a message (and a JSON saying why) when not root or without iproute2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.costmodel import AlphaBeta, fit_alpha_beta, predict_step
from benchmarks.launch import launch_ranks
from benchmarks.netns import Cluster, LinkSpec, remove_stale, skip_reason

__all__ = ["DEFAULT_METHODS", "MODEL", "run_config", "summarize"]

# ~7.3M params: a dense bf16 exchange (3 bytes/param/rank at W=4) takes ~0.2 s at 1 Gbit/s,
# about what forward+backward of 32 tokens takes here, so communication matters.
MODEL = {"layers": 4, "hidden": 384, "heads": 6, "ffn": 1024, "seq": 32, "batch": 1}
DEFAULT_METHODS = [
    {"name": "dense-adams"},
    {"name": "scape-90", "density": 0.1},
    {"name": "scape-99", "density": 0.01},
    {"name": "scape-90-sync", "density": 0.1, "overlap": False},
    {"name": "scape-99-sync", "density": 0.01, "overlap": False},
]
METHODS_BY_NAME = {m["name"]: m for m in DEFAULT_METHODS}
CALIBRATION = {"sizes": [4096, 65536, 524288, 2097152, 8388608], "reps": 3}
LOCAL_PHASES = ("pack", "update", "unpack", "mask_select", "mask_send", "mask_decode")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _fit(calibration: list[dict[str, Any]], world: int, op: str) -> AlphaBeta:
    points = [(world, c["nbytes"], _median(c["times"])) for c in calibration if c["op"] == op]
    return fit_alpha_beta(points)


def summarize(results: list[dict[str, Any]], world: int) -> dict[str, Any]:
    """Per-method medians across measured steps; each step counts at its slowest rank."""
    per_method: dict[str, list[list[dict[str, Any]]]] = {}
    n_rows = len(results[0]["steps"])
    for i in range(n_rows):
        rows = [res["steps"][i] for res in results]  # the same step on every rank
        if rows[0]["measured"]:
            per_method.setdefault(rows[0]["method"], []).append(rows)
    cal = results[0].get("calibration", [])
    fits, fit_error = {}, None
    if cal:
        try:
            fits = {"reduce_scatter": _fit(cal, world, "reduce_scatter"),
                    "all_gather": _fit(cal, world, "all_gather")}  # fmt: skip
        except ValueError as err:  # too noisy to separate latency from bandwidth
            fit_error = str(err)
    dense_name = next(n for n in per_method if n.startswith("dense"))
    dense_by_step = {
        rows[0]["step"]: max(r["wall"] for r in rows) for rows in per_method[dense_name]
    }
    methods = {}
    for name, steps in per_method.items():
        walls = [max(r["wall"] for r in rows) for rows in steps]
        phases = {
            ph: _median([max(r["phases"][ph] for r in rows) for rows in steps])
            for ph in steps[0][0]["phases"]
        }
        ratios = [dense_by_step[rows[0]["step"]] / max(r["wall"] for r in rows) for rows in steps
                  if rows[0]["step"] in dense_by_step]  # fmt: skip
        first = steps[0][0]
        overlaps = [
            r["mask_overlap"] for rows in steps for r in rows if r["mask_overlap"] is not None
        ]
        entry = {
            "step_s": _median(walls),
            "step_s_all": walls,
            "phases_s": phases,
            "bytes_per_rank": first["bytes"],
            "speedup_vs_dense": _median(ratios),
            "mask_overlap": _median(overlaps) if overlaps else None,
            "loss_last": steps[-1][0]["loss"],
        }
        if fits:
            compute = _median([max(r["phases"]["compute"] for r in rows) for rows in steps])
            local = _median([max(sum(r["phases"][p] for p in LOCAL_PHASES) for r in rows)
                             for rows in steps])  # fmt: skip
            spec = METHODS_BY_NAME.get(name, {})
            pred = predict_step(
                world_size=world, compute_s=compute, local_s=local,
                bytes_per_rank=first["bytes"], reduce_scatter=fits["reduce_scatter"],
                all_gather=fits["all_gather"], mask_overlapped=spec.get("overlap", True),
                mask_collectives=2 if spec.get("encoding") == "delta" else 1,
            )  # fmt: skip
            entry["predicted"] = pred.to_dict()
            entry["prediction_error"] = pred.total / entry["step_s"] - 1.0
        methods[name] = entry
    # Whole-run check of the byte counters against what the interfaces really sent.
    counted = sum(sum(r["bytes"].values()) for res in results for r in res["steps"])
    sent = [r["tx_bytes"] for res in results for r in res["steps"]]
    wire = None if any(s is None for s in sent) else sum(sent) / counted
    return {
        "methods": methods,
        "fits": {op: f.to_dict() for op, f in fits.items()},
        "fit_error": fit_error,
        "calibration": cal,
        "wire_over_counted_bytes": wire,
        "n_params": results[0]["n_params"],
        "shard_size": results[0]["shard_size"],
    }


def run_config(world: int, rate_mbit: float, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    spec = {
        "model": MODEL,
        "methods": DEFAULT_METHODS,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "calibrate": CALIBRATION,
        "reduce_scatter": "ring",
    }
    link = LinkSpec(rate_mbit)
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    with Cluster(world, link) as cluster:
        results = launch_ranks("benchmarks.rank_main", spec, tmp / f"w{world}-{link.label}",
                               world_size=world, cluster=cluster, timeout_s=args.timeout)  # fmt: skip
        qdisc = cluster.qdisc_stats()
    summary = summarize(results, world)
    summary.update(world_size=world, link={"rate_mbit": rate_mbit, "burst_bytes": link.burst,
                   "latency_ms": link.latency_ms, "label": link.label},
                   seconds=time.perf_counter() - start, loadavg=[load_before, os.getloadavg()[0]],
                   tc_dropped_packets=sum(int(n) for n in re.findall(r"dropped (\d+)", qdisc)))  # fmt: skip
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rates-mbit", type=float, nargs="+", default=[1000, 10000])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--out", type=Path, default=Path("results/bench/cluster.json"))
    args = parser.parse_args(argv)
    # SIGTERM (a killed make) must still run the finally/atexit teardown.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    reason = skip_reason()
    if reason:
        print(f"bench-cluster SKIPPED: {reason}")
        args.out.write_text(json.dumps({"skipped": reason}, indent=1))
        return 0
    stale = remove_stale()
    if stale:
        print(f"removed stale namespaces: {', '.join(stale)}")
    configs = []
    with tempfile.TemporaryDirectory(prefix="scape-bench-") as tmp:
        for world in args.worlds:
            for rate in args.rates_mbit:
                print(f"== emulated cluster: {world} ranks, {rate:g} Mbit/s links", flush=True)
                summary = run_config(world, rate, args, Path(tmp))
                for name, m in summary["methods"].items():
                    err = m.get("prediction_error")
                    print(f"  {name:16s} step {m['step_s'] * 1e3:7.1f} ms  "
                          f"x{m['speedup_vs_dense']:.2f} vs dense"
                          + ("" if err is None else f"  model {err:+.0%}"), flush=True)  # fmt: skip
                configs.append(summary)
    args.out.write_text(json.dumps({"model": MODEL, "configs": configs}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
