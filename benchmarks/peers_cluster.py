"""`make bench-peers-cluster`: the pretrain stage's step time on an emulated cluster for every
optimizer of the peers experiment (issue 8), ``results/peers/cluster.json``.

Each run steps one optimizer with the stage's engine on a fresh cluster, the first ``--skip``
steps left out (1-bit Adam freezes at the short ``train.warmup_steps``); methods in an order
rotated each repeat, each run a quiet-protocol round compared to dense AdamS of the *same*
repeat. ``methods`` and ``link.label`` are what ``pipelines.studies.peers_report`` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, quiet
from benchmarks.harness.launch import LAUNCH_ERRORS, error_summary, launch_ranks
from benchmarks.harness.netns import Cluster, LinkSpec
from benchmarks.harness.step import prepare_data, step_worker
from benchmarks.harness.step import summarize as summarize_steps

__all__ = ["EXPERIMENT", "REFERENCE", "default_methods", "main", "overrides_for", "summarize"]

EXPERIMENT = "peers_gpt345m_owt"
REFERENCE = "adams"  # dense AdamS: the method every other one is compared to


def default_methods() -> list[str]:
    """The optimizers the peers experiment sweeps (its ``sweep`` list)."""
    from omegaconf import OmegaConf

    return list(OmegaConf.load(cli.ROOT / "conf" / "experiment" / f"{EXPERIMENT}.yaml")["sweep"])


def overrides_for(method: str, *, warmup: int, world: int, output_root: Path,
                  data_root: Path) -> list[str]:  # fmt: skip
    """Pretrain overrides of one run: the experiment at tiny scale, no W&B, no progress bar."""
    return [f"experiment={EXPERIMENT}", "scale=tiny", f"optimizer={method}",
            f"train.warmup_steps={warmup}", "cluster.nodes=1", f"cluster.ranks_per_node={world}",
            "wandb.mode=disabled", "progress=false", f"output_root={output_root}",
            f"data_root={data_root}"]  # fmt: skip


def summarize(runs: list[dict[str, Any]], reference: str = REFERENCE) -> dict[str, Any]:
    """Per method: the median of its runs' medians, the median of its step over the reference's
    in the *same* repeat (the host drifts between repeats), its bytes, every run's error."""
    ok = [r for r in runs if r.get("step_time_s") is not None]
    ref = {r["repeat"]: r["step_time_s"] for r in ok if r["method"] == reference}
    methods: dict[str, Any] = {}
    for name in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == name]
        good = [r for r in mine if r.get("step_time_s") is not None]
        ratios = [r["step_time_s"] / ref[r["repeat"]] for r in good if r["repeat"] in ref]
        methods[name] = {
            "runs": len(mine), "runs_ok": len(good),
            "step_time_s": _median([r["step_time_s"] for r in good]),
            "step_time_s_runs": [r["step_time_s"] for r in good],
            "bytes_per_rank_step": _median([r["bytes_per_rank_step"] for r in good]),
            f"step_ratio_vs_{reference}": _median(ratios),
            "errors": [r["error"] for r in mine if r.get("error")],
        }  # fmt: skip
    return {"reference": reference, "methods": methods}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_one(method: str, repeat: int, args: argparse.Namespace, tmp: Path, attempt: int) -> dict[str, Any]:  # fmt: skip
    """One method's steps on a fresh cluster (or on loopback)."""
    out_dir = tmp / f"rep{repeat}-{method}-try{attempt}"
    overrides = overrides_for(method, warmup=args.warmup_steps, world=args.ranks,
                              output_root=out_dir / "runs", data_root=args.data_root)  # fmt: skip
    spec = {"methods": [{"name": method, "overrides": overrides}], "warmup": args.skip,
            "steps": args.steps - args.skip, "cache_dir": str(tmp / "dataset_cache")}  # fmt: skip
    record: dict[str, Any] = {"method": method, "repeat": repeat}  # run_round adds the load
    start = time.perf_counter()
    try:
        link = None if args.loopback else LinkSpec(args.rate_mbit)
        with Cluster(args.ranks, link) if link else contextlib.nullcontext() as cluster:
            results = launch_ranks(step_worker, spec, out_dir, world_size=args.ranks,
                                   cluster=cluster, timeout_s=args.timeout)  # fmt: skip
        m = summarize_steps(results)[method]
        record.update(step_time_s=m.step_s, step_time_s_all=m.step_s_all,
                      bytes_per_rank_step=sum(m.bytes_per_rank.values()),
                      bytes_by_kind=m.bytes_per_rank, loss_last=m.loss_last)  # fmt: skip
    except LAUNCH_ERRORS as err:
        record["error"] = error_summary(err, out_dir, args.ranks)
    return {**record, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, Path("results/peers/cluster.json"), cluster=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=1000)
    parser.add_argument("--steps", type=int, default=30, help="steps per run, --skip left out")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=5, help="1-bit Adam's freeze step")
    parser.add_argument("--skip", type=int, default=None, help="default: --warmup-steps + 2")
    parser.add_argument("--methods", nargs="+", default=None, help=f"default: {EXPERIMENT}'s sweep")
    args = parser.parse_args(argv)
    args.skip = args.warmup_steps + 2 if args.skip is None else args.skip
    if not 0 < args.skip < args.steps:
        parser.error(f"--skip {args.skip}: leave out at least SCAPE's dense first step and keep "
                     f"one of --steps {args.steps}")  # fmt: skip
    methods = args.methods or default_methods()
    if (protocol := cli.start("bench-peers-cluster", args, cluster=not args.loopback)) is None:
        return 0
    link = None if args.loopback else LinkSpec(args.rate_mbit)
    doc: dict[str, Any] = {
        "bench": "peers_cluster", "experiment": EXPERIMENT, "world_size": args.ranks,
        "link": {"rate_mbit": None, "label": "loopback (not shaped)"} if link is None
        else {"rate_mbit": link.rate_mbit, "label": link.label},
        "steps": args.steps, "warmup_steps": args.warmup_steps, "skip": args.skip,
        "repeats": args.repeats, "started_at": quiet.utc_now(), "host": quiet.host(),
        "protocol": protocol.to_dict(), "runs": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="scape-peers-bench-") as tmp:
        prepare_data(overrides_for(methods[0], warmup=1, world=args.ranks, output_root=Path(tmp),
                                   data_root=args.data_root))  # fmt: skip
        for repeat in range(args.repeats):
            k = repeat % len(methods)
            for method in methods[k:] + methods[:k]:
                print(f"== repeat {repeat + 1}/{args.repeats} {method} ({doc['link']['label']})", flush=True)  # fmt: skip
                tries = iter(range(1, args.retries + 2))  # a re-run gets a fresh directory
                record = quiet.run_round(f"{method} #{repeat + 1}", lambda m=method, r=repeat, t=tries:
                                         run_one(m, r, args, Path(tmp), next(t)), protocol)  # fmt: skip
                doc["runs"].append(record)
                print("   FAILED: " + record["error"].splitlines()[0] if "error" in record else
                      f"   step median {record['step_time_s'] * 1e3:.1f} ms, "
                      f"{record['bytes_per_rank_step'] / 1e3:,.1f} kB/rank/step", flush=True)  # fmt: skip
                # written after every run: a sweep that is stopped keeps what it has
                args.out.write_text(json.dumps({**doc, **summarize(doc["runs"])}, indent=1))
    doc.update(finished_at=quiet.utc_now(), **summarize(doc["runs"]))
    cli.write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
