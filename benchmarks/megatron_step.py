"""`make bench-step` / `make bench-floor-parts`: the pretrain stage's Megatron step on an emulated cluster.

One quiet-protocol round per rank count x link rate (ranks in network namespaces behind ``tc
tbf`` links; ``megatron_step.json``). In it each method runs in rank processes of its own: the
stage's ``engine.step`` at the slowest rank, its collectives timed bare at its step's sizes,
then its *floor* launch in PyTorch's fake process group (no transfer, no wait). The small model
makes dense AdamS's exchange a large part of its step, as in the paper. ``--parts``
(``floor_parts.json``): the floor under ``torch.profiler``, SCAPE's spans as proportions.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, quiet, step
from benchmarks.harness.launch import LAUNCH_ERRORS, error_summary, launch_ranks
from benchmarks.harness.netns import Cluster, LinkSpec
from benchmarks.harness.records import Call, MethodSteps, Point, Round, Sweep, from_json

__all__ = ["BENCH_MODEL", "DENSE", "PARTS", "SWEEP_METHODS", "main", "predict", "sweep_points"]

BENCH_MODEL = ["model=tiny_llama", "scale=tiny", "model.name=bench_llama", "model.num_layers=4",
               "model.hidden_size=384", "model.num_attention_heads=6",
               "model.ffn_hidden_size=1024", "model.seq_length=16", "train.micro_batch_size=1",
               "train.bucket_size=2500000"]  # fmt: skip
SWEEP_METHODS = {
    "dense-overlap": ["optimizer=adams", "train.overlap_grad_reduce=true"],
    "dense-no-overlap": ["optimizer=adams", "train.overlap_grad_reduce=false"],
    "scape-90": ["optimizer=scape90"],
    # the steady state the paper's per-step claims are about: the shipped SCAPE-99's density
    # ramp (its first 15% of steps, x1.4 the run's bytes) is left out of the timed steps
    "scape-99": ["optimizer=scape99", "optimizer.scape.ramp_start_sparsity=null",
                 "optimizer.scape.ramp_fraction=0"],
}  # fmt: skip
DENSE = ("dense-no-overlap", "dense-overlap")
PARTS = ("scape.pack", "scape.commit", "scape.update", "scape.select")
CALL_REPS = 3


def methods_for(world: int, data_root: Path, output_root: Path, extra: list[str] = (),
                only: list[str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each method's name and pretrain overrides at ``world`` ranks (``extra`` last), those
    matching a shell pattern of ``only``."""
    base = [*BENCH_MODEL, f"train.global_batch_size={world}", "cluster.nodes=1",
            f"cluster.ranks_per_node={world}", "wandb.mode=disabled", "progress=false",
            f"data_root={data_root}", f"output_root={output_root}"]  # fmt: skip
    out = [{"name": n, "overrides": [*base, *o, *extra]} for n, o in SWEEP_METHODS.items()
           if not only or any(fnmatch.fnmatchcase(n, p) for p in only)]  # fmt: skip
    if not out:
        raise SystemExit(f"--methods {' '.join(only)} matches none of {', '.join(SWEEP_METHODS)}")
    return out


def predict(m: MethodSteps, floor_s: float, backward_s: float | None,
            calls: list[Call]) -> dict[str, float]:  # fmt: skip
    """The cost model (seconds, by part): floor + each collective's exposed time at its bare
    timing; with Megatron's overlap the gradient sync hides behind backward up to (calls-1)/calls
    of it; SCAPE's mask all-gather, made a step ahead, hides behind the step's compute."""
    seconds = {c.kind: c.seconds for c in calls}
    n = max(1, m.value_collectives)
    sync_call = seconds.get("values" if m.values_in_grad_sync else "grad_values", 0.0)
    param = 0.0 if m.values_in_grad_sync else n * seconds.get("param_values", 0.0)
    mask = seconds.get("masks", 0.0)
    hide = (n - 1) / n * backward_s if m.overlap_grad_reduce and n > 1 and backward_s else 0.0
    grad = max(sync_call, n * sync_call - hide)
    mask = max(0.0, mask - floor_s) if m.values_in_grad_sync else mask
    return {"floor": floor_s, "grad": grad, "param": param, "mask": mask,
            "hidden_grad": n * sync_call - grad, "total": floor_s + grad + param + mask}  # fmt: skip


def paired_speedup(rnd: Round, refs: list[str], name: str) -> float | None:
    """Median over measured steps of (reference step / this method's step), same step
    index; several references: the fastest of them at each step."""
    ms = rnd.methods
    if name not in ms or any(r not in ms for r in refs):
        return None
    n = min(len(ms[r].step_s_all) for r in [*refs, name])
    return statistics.median(min(ms[r].step_s_all[i] for r in refs) / ms[name].step_s_all[i]
                             for i in range(n)) if n else None  # fmt: skip


def sweep_points(rounds: dict[str, Round]) -> list[Point]:
    """One point per (round, method)."""
    points = []
    for rnd in rounds.values():
        q = rnd.quiet
        for name, m in rnd.methods.items():
            floor = rnd.floors[name].step_s if name in rnd.floors else None
            p25, p75 = m.quartiles
            points.append(Point(
                round=rnd.name, world_size=rnd.world_size, link=rnd.link, method=name,
                label=m.label, step_s=m.step_s, step_s_p25=p25, step_s_p75=p75, floor_s=floor,
                bytes_per_rank=sum(m.bytes_per_rank.values()),
                speedup_vs_no_overlap=paired_speedup(rnd, ["dense-no-overlap"], name),
                speedup_vs_overlap=paired_speedup(rnd, ["dense-overlap"], name),
                speedup_vs_best_dense=paired_speedup(rnd, list(DENSE), name),
                predicted=predict(m, floor, rnd.backward_s, rnd.calls[name])
                if floor and rnd.calls.get(name) else None,
                load_before=q.load_before if q else None, load_after=q.load_after if q else None,
                noisy=bool(q and q.noisy)))  # fmt: skip
    return points


def run_round(name: str, w: int, rate: float, methods: list[dict[str, Any]],
              args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One round on a fresh cluster: per method its launch, then its floor launch."""
    link = None if args.loopback else LinkSpec(rate)
    record = Round(name, w, link.label if link else "loopback", link.rate_mbit if link else None)
    start, launch_dir, fwd_bwd = time.perf_counter(), out_dir, {}
    try:
        with Cluster(w, link) if link else contextlib.nullcontext() as cluster:
            for m in methods:
                spec = {"methods": [m], "warmup": args.warmup, "steps": args.steps,
                        "time_calls": CALL_REPS, "cache_dir": str(out_dir.parent / "dataset_cache")}  # fmt: skip
                launch_dir = out_dir / m["name"]
                res = launch_ranks(step.step_worker, spec, launch_dir, world_size=w,
                                   cluster=cluster, timeout_s=args.timeout)  # fmt: skip
                record.methods.update(step.summarize(res))
                record.calls.update(step.slowest_calls(res))
                launch_dir = out_dir / f"{m['name']}-floor"
                res = launch_ranks(step.step_worker, {**spec, "time_calls": None}, launch_dir,
                                   world_size=w, group="fake", timeout_s=args.timeout)  # fmt: skip
                record.floors.update(step.summarize(res))
                fwd_bwd[m["name"]] = step.forward_backward(res)
        # forward and backward of a dense method (what the overlap hides behind)
        ref = next((n for n in fwd_bwd if record.methods[n].optimizer != "scape"), None)
        record.forward_s, record.backward_s = fwd_bwd[ref or next(iter(fwd_bwd))]
    except LAUNCH_ERRORS as err:
        record.error = error_summary(err, launch_dir, w)
        print(f"   FAILED: {record.error}", flush=True)
    record.seconds = time.perf_counter() - start
    return dataclasses.asdict(record)


def _write(sweep: Sweep, out: Path) -> None:
    sweep.points = sweep_points({n: r for n, r in sweep.rounds.items() if r.error is None})
    out.write_text(json.dumps(dataclasses.asdict(sweep), indent=1))


def sweep(args: argparse.Namespace, protocol: quiet.Protocol, tmp: Path) -> None:
    """The rounds, the JSON after each; ends by the budget plus the round in progress."""
    doc = Sweep(commit=quiet.commit(), started_at=quiet.utc_now(), loopback=args.loopback, host=quiet.host(),
                protocol=protocol.to_dict(), bench_model=BENCH_MODEL, steps=args.steps,
                warmup=args.warmup)  # fmt: skip
    # CPU-bound rounds first, the slow link last: its ranks mostly wait, so the load the
    # next rank count's first round must settle from is low
    plan = [(w, r) for w in args.worlds for r in args.rates_mbit]
    deadline = time.monotonic() + args.budget_min * 60
    for i, (w, rate) in enumerate(plan, 1):
        name = f"w{w}-{LinkSpec(rate).label}"
        if time.monotonic() > deadline:
            doc.not_run.append(f"{name} (time budget {args.budget_min:g} min)")
            continue
        methods = methods_for(w, args.data_root, tmp / "runs", args.model_overrides, args.methods)
        print(f"== round {i}/{len(plan)} {name}: {w} ranks, "
              f"{'loopback' if args.loopback else LinkSpec(rate).label}, {len(methods)} methods "
              f"each in its own launches beside its floor, {args.warmup}+{args.steps} steps",
              flush=True)  # fmt: skip
        tries = iter(range(1, args.retries + 2))  # a re-run gets a fresh directory
        record = quiet.run_round(name, lambda n=name, w=w, r=rate, m=methods, t=tries: run_round(
            n, w, r, m, args, tmp / f"{n}-try{next(t)}"), protocol, deadline=deadline)  # fmt: skip
        doc.rounds[name] = from_json(Round, record)
        for m, e in doc.rounds[name].methods.items():
            floor = doc.rounds[name].floors.get(m)
            print(f"   {m:20s} {e.step_s * 1e3:8.1f} ms  floor "
                  f"{floor.step_s * 1e3 if floor else float('nan'):8.1f} ms", flush=True)  # fmt: skip
        _write(doc, args.out)
    doc.finished_at = quiet.utc_now()
    doc.complete = not doc.not_run and all(r.error is None for r in doc.rounds.values())
    _write(doc, args.out)
    print(f"wrote {args.out}" + ("" if doc.complete else " (incomplete)"))


def parts(args: argparse.Namespace, protocol: quiet.Protocol, tmp: Path) -> None:
    """Each method's floor launch under the profiler at ``--worlds``' first rank count."""
    w = args.worlds[0]
    methods = methods_for(w, args.data_root, tmp / "runs", args.model_overrides,
                          args.methods or ["dense-no-overlap", "scape-*"])  # fmt: skip

    def measure() -> dict[str, Any]:
        out = {}
        for m in methods:
            spec = {"methods": [m], "warmup": args.warmup, "steps": args.steps,
                    "profile_parts": True, "cache_dir": str(tmp / "dataset_cache")}  # fmt: skip
            res = launch_ranks(step.step_worker, spec, tmp / m["name"], world_size=w,
                               group="fake", timeout_s=args.timeout)  # fmt: skip
            e, (fwd, bwd) = step.summarize(res)[m["name"]], step.forward_backward(res)
            out[m["name"]] = {"step_s": e.step_s, "forward_s": fwd, "backward_s": bwd,
                              "parts_s": {k: statistics.fmean(r["parts"].get(k, 0.0) for r in res)
                                          for k in PARTS}, "n_params": e.n_params}  # fmt: skip
        return {"methods": out}

    started = quiet.utc_now()
    record = quiet.run_round(f"floor parts w{w}", measure, protocol)
    doc = {"bench": "floor_parts", "world_size": w, "steps": args.steps, "warmup": args.warmup,
           "started_at": started, "protocol": protocol.to_dict(), **record}  # fmt: skip
    cli.write_json(args.out, doc)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, cluster=True)
    parser.add_argument("--parts", action="store_true",
                        help="the floor by part under the profiler (make bench-floor-parts)")  # fmt: skip
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="rank counts")
    parser.add_argument("--rates-mbit", type=float, nargs="+", default=[10000.0, 1000.0, 100.0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per method")
    parser.add_argument("--warmup", type=int, default=3, help="steps per method left out")
    parser.add_argument("--budget-min", type=float, default=60.0,
                        help="start no round or re-run after this many minutes")  # fmt: skip
    parser.add_argument("--methods", nargs="+", default=None,
                        help=f"shell patterns over {', '.join(SWEEP_METHODS)}")  # fmt: skip
    parser.add_argument("--model-overrides", nargs="+", default=[],
                        help="pretrain overrides added to every method (functional checks)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps {args.steps} and --warmup {args.warmup} must be >= 1 "
                     "(SCAPE's first step is its dense warm-up)")  # fmt: skip
    if any(w < 2 for w in args.worlds):
        parser.error(f"--worlds {args.worlds}: every rank count must be >= 2")
    name = "floor_parts" if args.parts else "megatron_step"
    args.out = args.out or cli.ROOT / "results" / "bench" / f"{name}.json"
    protocol = cli.start(f"bench-step ({name})", args, cluster=not (args.parts or args.loopback))
    if protocol is None:
        return 0
    with tempfile.TemporaryDirectory(prefix="scape-step-bench-") as tmp:
        # every method trains on the same corpus
        first = methods_for(args.worlds[0], args.data_root, Path(tmp), args.model_overrides)[0]
        step.prepare_data(first["overrides"])
        (parts if args.parts else sweep)(args, protocol, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
