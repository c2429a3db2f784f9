"""`make bench-peers-cluster`: per-step wall time of the real pretrain stage on an emulated
cluster, for every optimizer of the peers experiment (issue 8).

    python -m benchmarks.peers_cluster --ranks 2 --rate-mbit 1000 --steps 30 --repeats 2 \
        --out results/peers/cluster.json

Each point is a whole trainer run of ``experiment=peers_gpt345m_owt scale=tiny`` with one
optimizer of that experiment's sweep (:func:`benchmarks.harness.workers.pretrain_worker`),
every rank in its own network namespace behind a ``tc tbf``-shaped link, a fresh cluster
per run. The trainer's ``step_time`` and bytes are read from rank 0's metrics.jsonl; eval
and checkpoints happen only after the last step. ``train.warmup_steps`` is small for every
method (1-bit Adam freezes its variance when the warm-up ends) and the first ``--skip``
steps (default warm-up + 2) are left out. Methods run one after another in an order
rotated each repeat, each run a quiet-protocol round, and each method is compared to dense
AdamS of the *same* repeat. The JSON's ``methods`` (name -> ``step_time_s``, ratios, bytes,
errors) and ``link.label`` are what ``pipelines.studies.peers_report`` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import quiet
from benchmarks.harness.launch import LaunchError, error_summary, launch_ranks
from benchmarks.harness.netns import Cluster, LinkSpec, ready_or_skip
from benchmarks.harness.workers import pretrain_worker

__all__ = ["EXPERIMENT", "REFERENCE", "default_methods", "main", "overrides_for", "run_stats",
           "summarize"]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "peers_gpt345m_owt"
REFERENCE = "adams"  # dense AdamS: the method every other one is compared to


def default_methods() -> list[str]:
    """The optimizers the peers experiment sweeps (its ``sweep`` list)."""
    from omegaconf import OmegaConf

    return list(OmegaConf.load(ROOT / "conf" / "experiment" / f"{EXPERIMENT}.yaml")["sweep"])


def overrides_for(method: str, *, steps: int, warmup: int, world: int, output_root: Path,
                  data_root: Path) -> list[str]:  # fmt: skip
    """Pretrain overrides of one run: the experiment at tiny scale; eval, checkpoints and
    the consistency check only after the last step; no W&B, no progress bar."""
    return [f"experiment={EXPERIMENT}", "scale=tiny", f"optimizer={method}",
            f"train.train_steps={steps}", f"train.warmup_steps={warmup}",
            f"train.eval_interval={steps}", "train.eval_iters=1",
            f"train.checkpoint_interval={steps}", f"train.consistency_check_interval={steps}",
            "cluster.nodes=1", f"cluster.ranks_per_node={world}", "wandb.mode=disabled",
            "progress=false", f"output_root={output_root}", f"data_root={data_root}"]  # fmt: skip


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_stats(rank0: dict[str, Any], skip: int) -> dict[str, Any]:
    """Medians over the measured steps (all but the first ``skip``) of one run's rank 0."""
    times, sent = rank0["step_time"][skip:], rank0["bytes"][skip:]
    if not times:
        raise ValueError(f"no measured steps: {len(rank0['step_time'])} steps, skip={skip}")
    kinds: dict[str, list[float]] = {}
    for by_kind in rank0.get("bytes_by_kind", [])[skip:]:
        for kind, n in by_kind.items():
            kinds.setdefault(kind, []).append(float(n))
    return {
        "step_time_s": statistics.median(times),
        "step_time_s_min": min(times),
        "bytes_per_rank_step": statistics.median(sent),
        "bytes_by_kind": {k: statistics.median(v) for k, v in sorted(kinds.items())},
        "measured_steps": len(times),
        "step_time_s_all": rank0["step_time"],
        "bytes_all": rank0["bytes"],
        "loss_last": rank0["loss"][-1] if rank0.get("loss") else None,
    }


def summarize(runs: list[dict[str, Any]], reference: str = REFERENCE) -> dict[str, Any]:
    """Per method, over the runs that succeeded.

    ``runs``: one dict per (repeat, method) with ``method``, ``repeat`` and, when it
    worked, ``step_time_s`` and ``bytes_per_rank_step`` (else ``error``). A method's
    ``step_time_s`` is the median over repeats of the per-run medians; ``step_ratio_vs_<reference>`` is the
    median over repeats of (this method's step / the reference's step in the same repeat),
    ``speedup_vs_<reference>`` the median of the inverse ratios, ``bytes_ratio`` the
    reference's bytes over this method's.
    """
    ok = [r for r in runs if r.get("step_time_s") is not None]
    ref_by_repeat = {r["repeat"]: r for r in ok if r["method"] == reference}
    methods: dict[str, Any] = {}
    for name in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == name]
        good = [r for r in mine if r.get("step_time_s") is not None]
        ratios = [r["step_time_s"] / ref_by_repeat[r["repeat"]]["step_time_s"]
                  for r in good if r["repeat"] in ref_by_repeat]  # fmt: skip
        speedups = [ref_by_repeat[r["repeat"]]["step_time_s"] / r["step_time_s"]
                    for r in good if r["repeat"] in ref_by_repeat]  # fmt: skip
        step = _median([r["step_time_s"] for r in good])
        sent = _median([r["bytes_per_rank_step"] for r in good])
        ref_sent = _median([r["bytes_per_rank_step"] for r in ref_by_repeat.values()])
        methods[name] = {
            "runs": len(mine),
            "runs_ok": len(good),
            "step_time_s": step,
            "step_time_s_runs": [r["step_time_s"] for r in good],
            "step_time_s_min": min(
                (r["step_time_s_min"] for r in good if "step_time_s_min" in r), default=None
            ),
            "bytes_per_rank_step": sent,
            "bytes_per_rank_step_runs": [r["bytes_per_rank_step"] for r in good],
            f"step_ratio_vs_{reference}": _median(ratios),
            f"step_ratio_vs_{reference}_runs": ratios,
            f"speedup_vs_{reference}": _median(speedups),
            "bytes_ratio": (ref_sent / sent) if ref_sent and sent else None,
            "loadavg_runs": [r.get("loadavg") for r in mine],
            "errors": [r["error"] for r in mine if r.get("error")],
        }
    return {"reference": reference, "methods": methods}


def _link_record(link: LinkSpec | None) -> dict[str, Any]:
    if link is None:  # pipelines.studies.peers_report reads link.label for its column heading
        return {"rate_mbit": None, "label": "loopback (not shaped)"}
    return {"rate_mbit": link.rate_mbit, "burst_bytes": link.burst, "label": link.label}


def run_one(method: str, repeat: int, args: argparse.Namespace, tmp: Path,
            attempt: int = 1) -> dict[str, Any]:  # fmt: skip
    """Train one method once on a fresh cluster (or on loopback) in a fresh run directory
    (a re-run of a disturbed round must not resume the first try's checkpoint)."""
    out_dir = tmp / f"rep{repeat}-{method}-try{attempt}"
    overrides = overrides_for(method, steps=args.steps, warmup=args.warmup_steps,
                              world=args.ranks, output_root=out_dir / "runs",
                              data_root=args.data_root.resolve())  # fmt: skip
    spec = {"overrides": overrides, "run_dir": str(out_dir / "run")}
    record: dict[str, Any] = {"method": method, "repeat": repeat}
    load_before, start = os.getloadavg()[0], time.perf_counter()
    try:
        link = None if args.loopback else LinkSpec(args.rate_mbit)
        with Cluster(args.ranks, link) if link else contextlib.nullcontext() as cluster:
            results = launch_ranks(pretrain_worker, spec, out_dir, world_size=args.ranks,
                                   cluster=cluster, timeout_s=args.timeout)  # fmt: skip
            if cluster is not None:
                record["tc_dropped_packets"] = cluster.dropped_packets()
        record.update(run_stats(results[0], args.skip))
        record["startup_and_teardown_s"] = results[0]["seconds"] - (
            results[0].get("train_seconds") or 0.0
        )
    except (LaunchError, OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        record["error"] = error_summary(err, out_dir, args.ranks)
    record["seconds"] = time.perf_counter() - start
    record["loadavg"] = [load_before, os.getloadavg()[0]]
    return record


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(summary: dict[str, Any]) -> None:
    ref = summary["reference"]
    print(f"{'method':14s} {'step ms':>9s} {'per run ms':>22s} {'kB/rank/step':>13s} "
          f"{'step/' + ref:>11s} {'bytes x':>8s}  errors")  # fmt: skip
    for name, m in summary["methods"].items():
        runs = ",".join(f"{s * 1e3:.0f}" for s in m["step_time_s_runs"]) or "-"
        ms = None if m["step_time_s"] is None else m["step_time_s"] * 1e3
        kb = None if m["bytes_per_rank_step"] is None else m["bytes_per_rank_step"] / 1e3
        print(f"{name:14s} {_fmt(ms, '9.1f'):>9s} {runs:>22s} "
              f"{_fmt(kb, ',.1f'):>13s} {_fmt(m[f'step_ratio_vs_{ref}'], '.3f'):>11s} "
              f"{_fmt(m['bytes_ratio'], '.1f'):>8s}  {len(m['errors'])}/{m['runs']}")  # fmt: skip
        for e in m["errors"][:1]:
            print("    " + e.replace("\n", "\n    "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=1000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=5,
        help="train.warmup_steps for every method (1-bit Adam's freeze step)",
    )
    parser.add_argument(
        "--skip",
        type=int,
        default=None,
        help="first steps left out of the medians (default: warm-up + 2)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"optimizer configs (default: the sweep of {EXPERIMENT})",
    )
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="no namespaces and no shaping: the ranks talk over 127.0.0.1",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--data-root", type=Path, default=ROOT / "data")
    parser.add_argument("--out", type=Path, default=Path("results/peers/cluster.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)  # fmt: skip
    protocol = quiet.protocol_from_args(args)
    if args.skip is None:
        args.skip = args.warmup_steps + 2
    if not 0 <= args.skip < args.steps:
        parser.error(f"--skip {args.skip} leaves no measured step of --steps {args.steps}")
    if not 1 <= args.warmup_steps <= args.steps:
        parser.error("--warmup-steps must be in [1, --steps] (1-bit Adam freezes there)")
    methods = args.methods or default_methods()
    # SIGTERM (a killed make) must still run the finally/atexit teardown.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    link = None if args.loopback else LinkSpec(args.rate_mbit)
    if not args.loopback and not ready_or_skip("bench-peers-cluster", args.out):
        return 0
    quiet.require_quiet("bench-peers-cluster", protocol.allow_busy)
    doc: dict[str, Any] = {
        "bench": "peers_cluster", "experiment": EXPERIMENT,
        "mode": "loopback" if args.loopback else "netns", "world_size": args.ranks,
        "link": _link_record(link), "steps": args.steps, "warmup_steps": args.warmup_steps,
        "skip": args.skip, "repeats": args.repeats, "method_order": methods,
        "overrides": overrides_for("<method>", steps=args.steps, warmup=args.warmup_steps,
                                   world=args.ranks, output_root=Path("<tmp>"),
                                   data_root=args.data_root.resolve()),
        "started_at": quiet.utc_now(), "host": quiet.host(), "loadavg_start": list(os.getloadavg()),
        "protocol": protocol.to_dict(), "runs": [],
    }  # fmt: skip
    where = "loopback" if link is None else f"{args.ranks} ranks x {link.label}"
    with tempfile.TemporaryDirectory(prefix="scape-peers-bench-") as tmp:
        for repeat in range(args.repeats):
            k = repeat % len(methods)
            for method in methods[k:] + methods[:k]:
                print(f"== repeat {repeat + 1}/{args.repeats} {method} ({where})", flush=True)
                tries = [0]

                def once(method=method, repeat=repeat, tries=tries):
                    tries[0] += 1
                    return run_one(method, repeat, args, Path(tmp), tries[0])

                record = quiet.run_round(f"{method} #{repeat + 1}", once, protocol)
                doc["runs"].append(record)
                if "error" in record:
                    print(f"   FAILED: {record['error'].splitlines()[0]}", flush=True)
                else:
                    print(f"   step median {record['step_time_s'] * 1e3:.1f} ms, "
                          f"{record['bytes_per_rank_step'] / 1e3:,.1f} kB/rank/step, "
                          f"run {record['seconds']:.0f} s, load {record['loadavg'][0]:.2f}"
                          f"->{record['loadavg'][1]:.2f}", flush=True)  # fmt: skip
                # Written after every run: a long sweep that is stopped keeps what it has.
                doc.update(summarize(doc["runs"]))
                args.out.write_text(json.dumps(doc, indent=1))
    doc["finished_at"] = quiet.utc_now()
    doc["loadavg_end"] = list(os.getloadavg())
    doc.update(summarize(doc["runs"]))
    args.out.write_text(json.dumps(doc, indent=1))
    print_table(doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
