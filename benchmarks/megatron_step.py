"""`make bench-step`: the pretrain stage's Megatron-Core train step on an emulated cluster.

    python -m benchmarks.megatron_step                     # the sweep (issue 14), 45-65 min
    python -m benchmarks.megatron_step --suite reproduce   # make reproduce-table's step times

**What is timed.** Each method is a pretrain-stage configuration (``optimizer=adams``,
``optimizer=scape99`` ...), built and stepped by :mod:`benchmarks.step_rank` with the stage's
own engine, schedule and data: the time of ``engine.step``, which the trainer logs as
``step_time`` (zero grads, forward/backward of the rank's micro-batches, gradient sync,
optimizer step, parameter sync). Ranks run in network namespaces joined by veths shaped
with ``tc tbf`` (:mod:`benchmarks.netns`); a step counts at its slowest rank. Each method
runs in rank processes of its own, as a training run does, in two passes of half the steps
in mirrored order (A B C D, then D C B A) so a drift of the machine hits all alike
(:func:`launch_plan`; ``--shared-process`` interleaves them step by step in one launch, the
old protocol, which slowed SCAPE's step by a fifth at 2 ranks).

**Rounds.** ``sweep``: for each rank count (2, 4) one round per link rate (100 Mbit/s,
1 Gbit/s, 10 Gbit/s), in which each method's launch is paired with its *floor* launch --
the same steps with collectives taken out (PyTorch's fake process group; see
:mod:`benchmarks.step_rank` for what it includes and excludes) -- run right after it (and
right before it in the mirrored pass): this machine's speed changes by up to x1.6 within an
hour with the load average unchanged (and more between sessions' machines), so a floor is
only comparable with steps timed in the same minutes. Methods: dense AdamS with Megatron's
gradient reduce-scatter overlapped with backward (``train.overlap_grad_reduce=true``) and not, SCAPE-90, SCAPE-99 (their configs as
users run them). ``reproduce``: one round, 2 ranks at 1 Gbit/s, of the tiny reproduction's
experiments and optimizers (what ``make reproduce-table`` trains); it writes the
``steptime.json`` the tables stage reads (:mod:`pipelines.efficiency`).

**The benchmark model** (sweep): a Llama of 4 layers, hidden 384, FFN 1024 (10.2M
parameters with the 4,096-entry vocabulary), 16 tokens per rank per step, Megatron buckets
of 2.5M elements (4 buckets). The paper's speed claim is about a communication-bound
step (a 1.8B model's dense exchange against one GPU's compute); on CPU cores the same
balance needs a small compute load: here dense AdamS's exchange (fp32 on CPU: 8 bytes per
parameter per rank and step) takes several times its compute at 1 Gbit/s, about as long at
10 Gbit/s and far longer at 100 Mbit/s, so the three rates span both sides of break-even.
Several buckets let Megatron's overlap hide reduce-scatters behind backward, as it does at
scale (Llama-1.8B has 45 buckets of 40M).

**Quiet machine** (:mod:`benchmarks.quiet`): refuses to start beside a study, the tests or
another benchmark; each round is one protocol round (load before/after, other processes'
CPU, re-run when disturbed, else marked noisy). **Bounded:** ``--budget-min``
stops starting rounds or re-runs after that many minutes (60), so a run ends by then plus the
round in progress (at most ~8 min); a launch has a timeout.
**Resumable:** the JSON is written after every round; started again at the same commit
with the same settings, an unfinished run keeps its quiet rounds and runs the rest
(``--fresh`` starts over); ``--rerun-noisy`` does the same for a finished run, running again
only the rounds it had to mark noisy or that failed (e.g. after waiting out the load that a
4-rank round leaves behind, with a longer ``--settle-s``).

**Cost model** (sweep): a method's predicted step = its floor + the exposed time of its
collectives. Each call is booked at the seconds of the same collective timed bare in the
round's namespaces at the step's own size (each method's first launch times them after its
steps: :func:`benchmarks.step_rank.step_calls`), or, for a call not timed, by the round's
alpha-beta fit of bare collectives of a few sizes (:func:`benchmarks.costmodel.fit_alpha_beta`).
With the overlap on, what travels during backward (dense: the reduce-scatters; SCAPE: its
values' all-reduces) hides behind it up to (buckets-1)/buckets of it, and the last call,
which starts when backward ends, is always exposed; SCAPE's mask all-gather, made a step
ahead, hides behind the step's compute. A hidden call is not free on shared cores: its CPU
seconds, measured on the same call timed bare, are booked as compute displaced when the
ranks fill the cores (see :func:`predict`).

Writes ``results/bench/megatron_step.json`` (sweep) or ``runs/steptime.json`` (reproduce):
``rounds`` (every step of every method at its slowest rank, calibration, protocol record),
``points`` (per round and method: median, quartiles, floor, speed-ups from per-step ratios,
bytes counted and on the wire, comm/compute ratio, model prediction and error, load).
Skips with a message and a JSON saying why when network namespaces are not available.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import quiet
from benchmarks.costmodel import AlphaBeta, fit_alpha_beta
from benchmarks.launch import LaunchError, error_summary, launch_ranks
from benchmarks.netns import Cluster, LinkSpec, ready_or_skip

__all__ = [
    "BENCH_MODEL",
    "SWEEP_METHODS",
    "plan_rounds",
    "predict",
    "summarize_round",
    "sweep_points",
]

ROOT = Path(__file__).resolve().parents[1]
BUCKET_SIZE = 2_500_000
BENCH_MODEL = [
    "model=tiny_llama",
    "scale=tiny",
    "model.name=bench_llama",
    "model.num_layers=4",
    "model.hidden_size=384",
    "model.num_attention_heads=6",
    "model.ffn_hidden_size=1024",
    "model.seq_length=16",
    "train.micro_batch_size=1",
    f"train.bucket_size={BUCKET_SIZE}",
]
SWEEP_METHODS = [
    {"name": "dense-overlap", "overrides": ["optimizer=adams", "train.overlap_grad_reduce=true"]},
    {"name": "dense-no-overlap",
     "overrides": ["optimizer=adams", "train.overlap_grad_reduce=false"]},
    {"name": "scape-90", "overrides": ["optimizer=scape90"]},
    {"name": "scape-99", "overrides": ["optimizer=scape99"]},
]  # fmt: skip
DENSE = ("dense-no-overlap", "dense-overlap")
CAL_SIZES = [1 << 16, 1 << 20, 1 << 23, 1 << 25]
CAL_REPS = 3
CAL_MAX_S = 1.5  # largest calibration message: at most this long at the link's rate
MAX_ROUND_S = 900.0
# A method's slower pass (median step) over its faster one above this: the machine or the
# links changed during the round (e.g. one pass at half the link rate), so it is re-run.
PASS_SPREAD_MAX = 1.5


# ---------------------------------------------------------------------------- the plan
def plan_rounds(suite: str, worlds: list[int], rates: list[float]) -> list[dict[str, Any]]:
    """The rounds in order: per rank count one per link rate, each with its methods' compute-
    only floors measured beside their steps (sweep); one 2-rank round at the first rate
    (reproduce). (Earlier runs had one floor round per rank count, ``floor-w<W>``; their JSON
    still reads. The machine's speed changes by up to x1.6 within an hour, unseen by the load
    average, so a floor from another round mismeasured step / floor and the model.)"""
    if suite == "reproduce":
        return [{"name": f"w{worlds[0]}-{LinkSpec(rates[0]).label}", "mode": "cluster",
                 "world_size": worlds[0], "rate_mbit": rates[0]}]  # fmt: skip
    return [{"name": f"w{w}-{LinkSpec(r).label}", "mode": "cluster", "world_size": w,
             "rate_mbit": r, "floor": True} for w in worlds for r in rates]  # fmt: skip


def _common(world: int, data_root: Path, output_root: Path) -> list[str]:
    return ["cluster.nodes=1", f"cluster.ranks_per_node={world}", "wandb.mode=disabled",
            "progress=false", f"data_root={data_root}", f"output_root={output_root}"]  # fmt: skip


def methods_for(suite: str, world: int, data_root: Path, output_root: Path,
                extra: list[str] = (), only: list[str] | None = None) -> list[dict]:  # fmt: skip
    """Each method's name and full pretrain overrides for a round of ``world``; ``extra``
    overrides go last, ``only`` keeps the names matching one of its shell patterns."""
    common = _common(world, data_root, output_root)
    if suite == "sweep":
        base = [*BENCH_MODEL, f"train.global_batch_size={world}", *common]
        out = [{"name": m["name"], "overrides": [*base, *m["overrides"], *extra]}
               for m in SWEEP_METHODS]  # fmt: skip
    else:
        import pipelines.reproduce as reproduce
        from pipelines.training.config import compose

        # the scale config make reproduce-table trains with (tiny_table once it has its own)
        scale = getattr(reproduce, "SCALE_CONFIGS", {}).get("tiny", "tiny")
        out = []
        for exp in reproduce.TINY_EXPERIMENTS:
            base = [f"experiment={exp}", f"scale={scale}", *common]
            for opt in compose(base).sweep:
                out.append({"name": f"{exp}/{opt}", "experiment": exp, "config": opt,
                            "overrides": [*base, f"optimizer={opt}", *extra]})  # fmt: skip
    if only:
        out = [m for m in out if any(fnmatch.fnmatchcase(m["name"], p) for p in only)]
        if not out:
            raise SystemExit(f"--methods {' '.join(only)} matches no method of --suite {suite}")
    return out


def calibration_sizes(rate_mbit: float, world: int) -> list[int]:
    """Message sizes that take at most CAL_MAX_S to send whole at the rate (at least 3): a
    ring sends (W-1)/W of one, gloo's reduce-scatter about all of it."""
    per_s = rate_mbit * 1e6 / 8
    fit = [n for n in CAL_SIZES if n / per_s <= CAL_MAX_S]
    return fit if len(fit) >= 3 else CAL_SIZES[:3]


# ---------------------------------------------------------------------------- summaries
def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _slowest_steps(results: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """method -> measured step -> seconds at the slowest rank."""
    out: dict[str, dict[int, float]] = {}
    for res in results:
        for row in res["steps"]:
            if row["measured"]:
                by_step = out.setdefault(row["method"], {})
                by_step[row["step"]] = max(by_step.get(row["step"], 0.0), row["seconds"])
    return out


def summarize_round(results: list[dict[str, Any]], world: int) -> dict[str, Any]:
    """Per method: the step at its slowest rank (median, quartiles, range), bytes counted by
    rank 0's engine and sent on the wire per rank, the loss; the calibration per op and size
    (slowest rank per repetition) and, from floor launches, forward and backward seconds."""
    slow = _slowest_steps(results)
    r0 = results[0]
    methods = {}
    for name, by_step in slow.items():
        times = [by_step[s] for s in sorted(by_step)]
        rows0 = [r for r in r0["steps"] if r["method"] == name and r["measured"]]
        kinds = sorted({k for r in rows0 for k in r.get("bytes", {})})
        counted = {k: statistics.median(r["bytes"].get(k, 0.0) for r in rows0) for k in kinds}
        wire = [statistics.fmean(res_row["tx_bytes"] for res_row in rows)
                for rows in _rows_by_step(results, name)
                if all(r["tx_bytes"] is not None for r in rows)]  # fmt: skip
        p25, p75 = _quartiles(times)
        methods[name] = {
            **r0["methods"][name],
            "step_s": statistics.median(times), "step_s_p25": p25, "step_s_p75": p75,
            "step_s_min": min(times), "step_s_max": max(times), "n_steps": len(times),
            "step_s_all": times,
            "bytes_per_rank": counted, "bytes_per_rank_total": sum(counted.values()),
            "wire_bytes_per_rank": statistics.median(wire) if wire else None,
            "loss_last": rows0[-1].get("loss") if rows0 else None,
        }  # fmt: skip
    out: dict[str, Any] = {"methods": methods}
    if r0.get("calibration"):
        cal = []
        for i, c in enumerate(r0["calibration"]):
            per_rep = [max(res["calibration"][i]["times"][j] for res in results)
                       for j in range(len(c["times"]))]  # fmt: skip
            cal.append({"op": c["op"], "nbytes": c["nbytes"], "times": per_rep,
                        "tx_bytes": c["tx_bytes"]})  # fmt: skip
        out["calibration"] = cal
        try:
            ops = sorted({c["op"] for c in cal})  # older rounds timed no all_reduce
            out["fits"] = {op: _fit(cal, world, op).to_dict() for op in ops}
        except ValueError as err:  # too noisy to separate latency from bandwidth
            out["fit_error"] = str(err)
    if r0.get("step_calls"):
        out["step_calls"] = {
            name: {c["kind"]: _slowest_collective(results, name, i, c)
                   for i, c in enumerate(calls)}
            for name, calls in r0["step_calls"].items()
        }  # fmt: skip
    if r0.get("fwd_bwd"):
        reps = len(r0["fwd_bwd"])
        fwd = [max(res["fwd_bwd"][i][0] for res in results) for i in range(reps)]
        bwd = [max(res["fwd_bwd"][i][1] for res in results) for i in range(reps)]
        out["fwd_bwd"] = {"method": r0["fwd_bwd_method"], "forward_s": statistics.median(fwd),
                          "backward_s": statistics.median(bwd)}  # fmt: skip
    return out


def _slowest_collective(results: list[dict[str, Any]], name: str, i: int,
                        call: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """One of a method's timed collectives: each repetition at its slowest rank, and their
    median (the seconds the model books per call); the CPU seconds a rank's process used in
    it, the ranks' mean per repetition, and their median (``cpu_s``; runs before it: none)."""
    reps = range(len(call["times"]))
    per_rep = [max(res["step_calls"][name][i]["times"][j] for res in results) for j in reps]
    out = {"op": call["op"], "nbytes": call["nbytes"], "times": per_rep,
           "seconds": statistics.median(per_rep)}  # fmt: skip
    if "cpu_times" in call:
        cpu = [statistics.fmean(res["step_calls"][name][i]["cpu_times"][j] for res in results)
               for j in reps]  # fmt: skip
        out.update(cpu_times=cpu, cpu_s=statistics.median(cpu))
    return out


def _rows_by_step(results: list[dict[str, Any]], name: str) -> list[list[dict[str, Any]]]:
    steps = sorted(
        {r["step"] for r in results[0]["steps"] if r["method"] == name and r["measured"]}
    )
    return [[next(r for r in res["steps"] if r["method"] == name and r["step"] == s)
             for res in results] for s in steps]  # fmt: skip


def _fit(cal: list[dict[str, Any]], world: int, op: str) -> AlphaBeta:
    return fit_alpha_beta((world, c["nbytes"], statistics.median(c["times"]))
                          for c in cal if c["op"] == op)  # fmt: skip


def paired_speedup(round_: dict[str, Any], ref: str | list[str], name: str) -> float | None:
    """Median over measured steps of (reference step / this method's step), same step index;
    a list of references: the fastest of them at each step."""
    ms = round_["methods"]
    refs = [ref] if isinstance(ref, str) else ref
    if name not in ms or any(r not in ms for r in refs):
        return None
    n = min(len(ms[r]["step_s_all"]) for r in [*refs, name])
    ratios = [min(ms[r]["step_s_all"][i] for r in refs) / ms[name]["step_s_all"][i]
              for i in range(n)]  # fmt: skip
    return statistics.median(ratios) if ratios else None


def predict(method: dict[str, Any], floor_s: float, backward_s: float | None,
            fits: dict[str, dict[str, float]], world: int,
            timed: dict[str, dict[str, Any]] | None = None,
            cores: int | None = None) -> dict[str, float]:  # fmt: skip
    """The cost model for one method in one round (seconds, by part).

    Dense: per bucket a gradient reduce-scatter (hidden behind backward with Megatron's
    overlap, up to (buckets-1)/buckets of it) and a parameter all-gather after the step.
    SCAPE (``values_in_grad_sync``): its values' all-reduces -- both passes, booked as
    gradient and parameter values -- are started during backward and hide alike; its one mask
    all-gather per step is made a step ahead and hides behind the step's compute. The last
    call of the gradient sync starts when backward ends, so at least it is exposed.

    Each call's seconds: the same collective timed bare in the round at the step's own size
    (``timed``: kind -> ``{"seconds": ...}``, from :func:`benchmarks.step_rank.step_calls`)
    where the round has it, since gloo's CPU-bound collectives are not linear in size (one
    line through sizes of 64 kB-32 MB misses 10 MB buckets by up to 2x); otherwise the
    round's alpha-beta fit of that collective (SCAPE's values by the all-reduce fit -- gloo's
    all-reduce sends the ring's volume, its reduce-scatter about twice it -- or, in rounds
    without one, by the reduce-scatter and all-gather fits).

    Hiding is not free where compute and collectives share the cores: a hidden call's CPU
    time (gloo's threads reducing and copying, the kernel's network stack), measured on the
    same call timed bare (``timed[kind]["cpu_s"]``, its share of the call's seconds), is
    work the cores no longer do for compute. When the ranks fill the cores (``world >=
    cores``), every rank's hidden CPU seconds spread over the cores: ``displaced`` = hidden
    seconds x CPU share x world / cores. Where the call was not timed, or the ranks leave
    cores free, nothing is booked."""
    if world <= 1:
        return {"floor": floor_s, "grad": 0.0, "param": 0.0, "mask": 0.0, "total": floor_s}
    timed = timed or {}
    rs, ag = AlphaBeta.from_dict(fits["reduce_scatter"]), AlphaBeta.from_dict(fits["all_gather"])
    calls = max(1, int(method.get("value_collectives") or method.get("buckets") or 1))
    b = method["bytes_per_rank"]

    def per_call(kind: str, link: AlphaBeta, n_calls: int, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if kind in timed:
            return timed[kind]["seconds"]
        return (world - 1) * link.alpha_s + nbytes / n_calls / link.bandwidth_Bps

    def cpu_share(kind: str) -> float:
        t = timed.get(kind) or {}
        return min(1.0, t["cpu_s"] / t["seconds"]) if t.get("cpu_s") and t["seconds"] else 0.0

    grad_b, param_b = b.get("grad_values", 0.0), b.get("param_values", 0.0)
    sync_kind = "values" if method.get("values_in_grad_sync") else "grad_values"
    if not method.get("values_in_grad_sync"):
        sync_call = per_call("grad_values", rs, calls, grad_b)
        param = calls * per_call("param_values", ag, calls, param_b)
    elif "values" in timed or "all_reduce" in fits:
        ar = AlphaBeta.from_dict(fits["all_reduce"]) if "all_reduce" in fits else rs
        sync_call, param = per_call("values", ar, calls, grad_b + param_b), 0.0
    else:
        sync_call = per_call("", rs, calls, grad_b) + per_call("", ag, calls, param_b)
        param = 0.0
    mask = per_call("masks", ag, 1, b.get("masks", 0.0))
    in_sync = calls * sync_call
    hide = 0.0
    if method.get("overlap_grad_reduce") and calls > 1 and backward_s:
        hide = (calls - 1) / calls * backward_s
    exposed_sync = max(sync_call, in_sync - hide)
    exposed_mask = max(0.0, mask - floor_s) if method.get("delay_mask") else mask
    hidden_cpu = ((in_sync - exposed_sync) * cpu_share(sync_kind)
                  + (mask - exposed_mask) * cpu_share("masks"))  # fmt: skip
    displaced = hidden_cpu * world / cores if cores and world >= cores else 0.0
    total = floor_s + exposed_sync + param + exposed_mask + displaced
    return {"floor": floor_s, "grad": exposed_sync, "param": param, "mask": exposed_mask,
            "hidden_grad": in_sync - exposed_sync, "displaced": displaced, "total": total}  # fmt: skip


def sweep_points(rounds: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per (cluster round, method): the figures section 2 and the map show."""
    points = []
    for name, rnd in rounds.items():
        if rnd.get("mode") != "cluster" or "methods" not in rnd:
            continue
        w = rnd["world_size"]
        # the round's own floors; an older run's floor round of the same rank count
        floor = rnd.get("floor") or rounds.get(f"floor-w{w}", {})
        floor_noisy = ((rnd if "floor" in rnd else floor).get("quiet") or {}).get("noisy")
        floor_methods = floor.get("methods", {})
        backward = (floor.get("fwd_bwd") or {}).get("backward_s")
        for m, e in rnd["methods"].items():
            f = floor_methods.get(m, {}).get("step_s")
            p: dict[str, Any] = {
                "round": name, "world_size": w, "link": rnd["link"]["label"],
                "rate_mbit": rnd["link"]["rate_mbit"], "method": m, "label": e["label"],
                "step_s": e["step_s"], "step_s_p25": e["step_s_p25"], "step_s_p75": e["step_s_p75"],
                "step_s_min": e["step_s_min"], "step_s_max": e["step_s_max"], "n_steps": e["n_steps"],
                "floor_s": f, "floor_noisy": floor_noisy, "floor_in_round": "floor" in rnd,
                "step_over_floor": e["step_s"] / f if f else None,
                "comm_over_compute": (e["step_s"] - f) / f if f else None,
                "bytes_per_rank": e["bytes_per_rank_total"],
                "wire_bytes_per_rank": e["wire_bytes_per_rank"],
                **{f"speedup_vs_{d}": paired_speedup(rnd, d, m) for d in DENSE},
                "speedup_vs_best_dense": paired_speedup(rnd, list(DENSE), m),
                "load_before": (rnd.get("quiet") or {}).get("load_before"),
                "load_after": (rnd.get("quiet") or {}).get("load_after"),
                "other_cores": (rnd.get("quiet") or {}).get("other_cores"),
                "noisy": (rnd.get("quiet") or {}).get("noisy"),
                "noisy_reason": (rnd.get("quiet") or {}).get("noisy_reason"),
            }  # fmt: skip
            if f and rnd.get("fits"):
                pred = predict(e, f, backward, rnd["fits"], w,
                               rnd.get("step_calls", {}).get(m), rnd.get("cores"))  # fmt: skip
                p["predicted"] = pred
                p["model_error"] = pred["total"] / e["step_s"] - 1.0
            points.append(p)
    return points


def reproduce_points(rounds: dict[str, dict[str, Any]], methods: list[dict]) -> list[dict]:
    """Per (experiment, optimizer): what ``pipelines.efficiency`` reads."""
    points = []
    for rnd in rounds.values():
        if "methods" not in rnd:
            continue
        q = rnd.get("quiet") or {}
        for m in methods:
            e = rnd["methods"].get(m["name"])
            if e is None:
                continue
            ref = f"{m['experiment']}/adams"
            points.append({
                "experiment": m["experiment"], "optimizer": e["label"], "config": m["config"],
                "world_size": rnd["world_size"], "link": rnd["link"]["label"],
                "step_s": e["step_s"], "step_s_p25": e["step_s_p25"], "step_s_p75": e["step_s_p75"],
                "n_steps": e["n_steps"], "bytes_per_rank": e["bytes_per_rank_total"],
                "speedup_vs_reference": paired_speedup(rnd, ref, m["name"]), "reference": "AdamS",
                "load_before": q.get("load_before"), "load_after": q.get("load_after"),
                "noisy": q.get("noisy"), "noisy_reason": q.get("noisy_reason"),
            })  # fmt: skip
    return points


# ---------------------------------------------------------------------------- running


def launch_plan(methods: list[dict], steps: int, warmup: int, shared_process: bool,
                floor: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """The launches of one round: each ``{"methods", "pass", "steps", "step_offset", "mode"}``
    (``mode`` None: the round's own; ``"floor"``: the compute-only floor).

    By default every method runs in processes of its own, as a training run does, in two
    passes of half the steps in mirrored order (A B C D, then D C B A): a linear drift of
    the machine hits every method alike. Sharing one process between methods, interleaved
    step by step (``shared_process``, the old protocol), lets one method's leftovers --
    gloo's buffers of tens of MB, the allocator's state -- slow another's step: SCAPE-99 at
    2 ranks x 10 Gbit/s took 235 ms interleaved with the dense methods and 183-204 ms alone.
    ``step_offset`` renumbers a pass's steps after the previous pass's.

    With ``floor``, each launch is followed (pass 0) or preceded (pass 1) by the same
    method's floor launch, so that step and floor are measured minutes apart, in the same
    state of the machine, and the floors' order mirrors too."""
    if shared_process:
        plan = [{"methods": methods, "pass": 0, "steps": steps, "step_offset": 0, "mode": None}]
        return plan + [dict(plan[0], mode="floor")] if floor else plan
    first = (steps + 1) // 2
    passes = [(methods, first), (methods[::-1], steps - first)]
    plan = []
    for p, (order, n) in enumerate(passes):
        if n == 0:
            continue
        for m in order:
            lp = {"methods": [m], "pass": p, "steps": n, "step_offset": p * (warmup + first),
                  "mode": None}  # fmt: skip
            pair = [lp, dict(lp, mode="floor")] if floor else [lp]
            plan += pair[::-1] if p else pair
    return plan


def merge_launches(launches: list[tuple[dict[str, Any], list[dict[str, Any]]]]
                   ) -> list[dict[str, Any]]:  # fmt: skip
    """Per rank, one result as if every launch of the round had been one: steps renumbered
    by their launch's ``step_offset``, the first calibration, every method's collective
    timings, and forward/backward from the first launch that timed a dense method."""
    merged: list[dict[str, Any]] = []
    for launch, results in launches:
        offset = launch["step_offset"]
        for r, res in enumerate(results):
            if r == len(merged):
                merged.append({"rank": r, "mode": res.get("mode"), "methods": {}, "steps": []})
            out = merged[r]
            out["methods"].update(res["methods"])
            out["steps"] += [{**row, "step": row["step"] + offset} for row in res["steps"]]
            if "calibration" in res and "calibration" not in out:
                out["calibration"] = res["calibration"]
            for name, calls in (res.get("step_calls") or {}).items():
                out.setdefault("step_calls", {}).setdefault(name, calls)
    for r, out in enumerate(merged):  # a dense method's forward/backward, else any
        timed = [res[r] for _, res in launches if res[r].get("fwd_bwd")]
        dense = [x for x in timed
                 if x["methods"].get(x["fwd_bwd_method"], {}).get("optimizer") != "scape"]  # fmt: skip
        if timed:
            out["fwd_bwd_method"] = (dense or timed)[0]["fwd_bwd_method"]
            out["fwd_bwd"] = (dense or timed)[0]["fwd_bwd"]
    return merged


def pass_check(methods: dict[str, dict[str, Any]], plan: list[dict[str, Any]]) -> dict[str, Any]:
    """Each method's median step in each pass (``pass_medians``), and ``disturbed`` when a
    method's passes differ by more than PASS_SPREAD_MAX: the two passes run the same steps,
    so only a change of the machine or the links between them makes them disagree."""
    first = {lp["methods"][0]["name"]: lp["steps"] for lp in plan if lp["pass"] == 0}
    medians, worst = {}, None
    for name, e in methods.items():
        n0 = first.get(name, 0)
        halves = [e["step_s_all"][:n0], e["step_s_all"][n0:]]
        if len(plan) < 2 or not all(halves):
            continue
        medians[name] = [statistics.median(h) for h in halves]
        spread = max(medians[name]) / min(medians[name])
        if spread > PASS_SPREAD_MAX and (worst is None or spread > worst[0]):
            worst = (spread, name)
    out: dict[str, Any] = {"pass_medians": medians} if medians else {}
    if worst:
        a, b = medians[worst[1]]
        out["disturbed"] = (f"its two passes disagree: {worst[1]} {a:.3g} s then {b:.3g} s "
                            f"(x{worst[0]:.2f} > x{PASS_SPREAD_MAX})")  # fmt: skip
    return out


def run_round_once(rnd: dict[str, Any], methods: list[dict], args: argparse.Namespace,
                   tmp: Path, attempt: list[int]) -> dict[str, Any]:  # fmt: skip
    """Run one round's launches (:func:`launch_plan`; a fresh cluster for the round); its
    summarized record."""
    attempt[0] += 1
    w = rnd["world_size"]
    out_dir = tmp / f"{rnd['name']}-try{attempt[0]}"
    link = None if args.loopback else LinkSpec(rnd["rate_mbit"])
    calibrate = None
    if args.suite == "sweep":
        calibrate = {"sizes": calibration_sizes(rnd["rate_mbit"], w), "reps": CAL_REPS}
    with_floor = bool(rnd.get("floor"))
    plan = launch_plan(methods, args.steps, args.warmup, args.shared_process, with_floor)
    record: dict[str, Any] = {"name": rnd["name"], "mode": rnd["mode"], "world_size": w,
                              "link": _link_record(link, args.loopback),
                              "launches": len(plan),
                              # the cores the ranks run on (the model's displaced term)
                              "cores": len(os.sched_getaffinity(0))}  # fmt: skip
    start = time.perf_counter()
    done: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    timed: set[str] = set()  # methods whose collectives are timed (in their first launch)
    launch_dir = out_dir
    try:
        with Cluster(w, link) if link is not None else contextlib.nullcontext() as cluster:
            for i, launch in enumerate(plan):
                names = [m["name"] for m in launch["methods"]]
                own = launch["mode"] is None  # else a floor launch: no cluster, no timings
                spec = {"mode": launch["mode"] or rnd["mode"],
                        "methods": [{"name": m["name"], "overrides": m["overrides"]}
                                    for m in launch["methods"]],
                        "warmup": args.warmup, "steps": launch["steps"],
                        "calibrate": calibrate if i == 0 else None,
                        "time_step_calls": None if calibrate is None or not own
                        or timed.issuperset(names) else CAL_REPS,
                        "cache_dir": str(tmp / "dataset_cache"), "timeout_s": args.timeout}  # fmt: skip
                if own:
                    timed.update(names)
                launch_dir = out_dir / f"launch{i}"
                results = launch_ranks("benchmarks.step_rank", spec, launch_dir, world_size=w,
                                       cluster=cluster if own else None, timeout_s=args.timeout)  # fmt: skip
                done.append((launch, results))
            if cluster is not None:
                qdisc = cluster.qdisc_stats()
                record["tc_dropped_packets"] = sum(
                    int(n) for n in re.findall(r"dropped (\d+)", qdisc)
                )
        record.update(_summarize_launches(done, w, None))
        if with_floor:
            record["floor"] = _summarize_launches(done, w, "floor")
            if "disturbed" in record["floor"]:
                record["disturbed"] = "floor: " + record["floor"]["disturbed"]
    except (LaunchError, OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        record["error"] = error_summary(err, launch_dir, w)
        print(f"   FAILED: {record['error']}", flush=True)
    record["seconds"] = time.perf_counter() - start
    return record


def _summarize_launches(done: list[tuple[dict[str, Any], list[dict[str, Any]]]], world: int,
                        mode: str | None) -> dict[str, Any]:  # fmt: skip
    """The summary and pass check of a round's launches of one ``mode`` (None: its steps;
    ``"floor"``: their floors)."""
    picked = [(lp, res) for lp, res in done if lp["mode"] == mode]
    out = summarize_round(merge_launches(picked), world)
    return {**out, **pass_check(out["methods"], [lp for lp, _ in picked])}


def _link_record(link: LinkSpec | None, loopback: bool) -> dict[str, Any]:
    if link is None:
        return {"rate_mbit": None, "label": "loopback (not shaped)", "loopback": loopback}
    return {"rate_mbit": link.rate_mbit, "burst_bytes": link.burst,
            "latency_ms": link.latency_ms, "label": link.label}  # fmt: skip


def prepare_data(methods_by_world: dict[int, list[dict]]) -> None:
    """Prepare the corpus the methods train on if it is not there yet (the prepare stage)."""
    from data_prep.config import PrepareConfig
    from data_prep.dataset import prepared_dir
    from pipelines.prepare import run as prepare_run
    from pipelines.training.config import compose

    seen = set()
    for methods in methods_by_world.values():
        for m in methods:
            cfg = compose(m["overrides"])
            key = (cfg.data_root, cfg.data.name, cfg.tokenizer.name)
            if key in seen:
                continue
            seen.add(key)
            if not (prepared_dir(*key) / "metadata.json").is_file():
                print(
                    f"preparing {cfg.data.name} with {cfg.tokenizer.name} in {cfg.data_root}",
                    flush=True,
                )
                prepare_run(
                    PrepareConfig(data=cfg.data, tokenizer=cfg.tokenizer, output_root=cfg.data_root)
                )


def _git(*argv: str) -> str | None:
    try:
        out = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def fingerprint(settings: dict[str, Any]) -> dict[str, Any]:
    """What must match for an unfinished run's rounds to be reused: commit, uncommitted
    changes of the code that runs, and the settings."""
    diff = _git("diff", "HEAD", "--", "scape", "pipelines", "benchmarks", "conf") or ""
    return {"commit": (_git("rev-parse", "HEAD") or "").strip() or None,
            "uncommitted": hashlib.sha256(diff.encode()).hexdigest()[:16],
            "settings": hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]}  # fmt: skip


def _resumable(out: Path, fp: dict[str, Any], fresh: bool,
               rerun_noisy: bool = False) -> tuple[dict[str, dict[str, Any]], str | None]:  # fmt: skip
    """The quiet rounds of the last run at ``out`` to keep (an unfinished run's, or with
    ``rerun_noisy`` a finished one's), and when that run started."""
    if fresh or not out.is_file():
        return {}, None
    try:
        old = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        return {}, None
    if (old.get("complete") and not rerun_noisy) or old.get("fingerprint") != fp:
        return {}, None
    kept = {n: r for n, r in old.get("rounds", {}).items()
            if "error" not in r and not (r.get("quiet") or {}).get("noisy")}  # fmt: skip
    return kept, old.get("started_at") if kept else None


def _host() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "machine": platform.machine()}  # fmt: skip


def _write(doc: dict[str, Any], out: Path, methods_by_world: dict[int, list[dict]]) -> None:
    if doc["suite"] == "sweep":
        doc["points"] = sweep_points(doc["rounds"])
    else:
        pts = reproduce_points(doc["rounds"], next(iter(methods_by_world.values())))
        doc["loopback_points" if doc["mode"] == "loopback" else "points"] = pts
    out.write_text(json.dumps(doc, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["sweep", "reproduce"], default="sweep")
    parser.add_argument(
        "--worlds",
        type=int,
        nargs="+",
        default=None,
        help="rank counts (sweep default: 2 4; reproduce: 2)",
    )
    parser.add_argument(
        "--rates-mbit",
        type=float,
        nargs="+",
        default=None,
        help="link rates (sweep default: 10000 1000 100; reproduce: 1000)",
    )
    parser.add_argument("--steps", type=int, default=None, help="measured steps per method")
    parser.add_argument("--warmup", type=int, default=3, help="steps per method left out")
    parser.add_argument(
        "--budget-min",
        type=float,
        default=60.0,
        help="start no round or re-run after this many minutes",
    )
    parser.add_argument("--timeout", type=float, default=MAX_ROUND_S, help="seconds per launch")
    parser.add_argument(
        "--fresh", action="store_true", help="do not reuse an unfinished run's rounds"
    )
    parser.add_argument(
        "--rerun-noisy",
        action="store_true",
        help="a finished run at this commit and settings: keep its quiet rounds, run again "
        "only its noisy or failed ones",
    )
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="no namespaces or shaping (functional checks; not a speed measure)",
    )
    parser.add_argument(
        "--on-busy",
        choices=["error", "skip"],
        default="error",
        help="beside a study/tests: exit with an error, or write a skip record",
    )
    parser.add_argument(
        "--shared-process",
        action="store_true",
        help="the old protocol: all methods in one launch per round, interleaved step by step "
        "(default: each method in processes of its own, two passes in mirrored order)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="keep these methods (shell patterns, e.g. 'dense-*' '*/scape99')",
    )
    parser.add_argument(
        "--model-overrides",
        nargs="+",
        default=[],
        help="pretrain overrides added to every method (functional checks)",
    )
    parser.add_argument("--data-root", type=Path, default=ROOT / "data")
    parser.add_argument("--out", type=Path, default=None)
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)  # fmt: skip
    reproduce = args.suite == "reproduce"
    args.worlds = args.worlds or ([2] if reproduce else [2, 4])
    # CPU-bound rounds first, the slow link last: its ranks mostly wait, so the load the next
    # rank count's first round must settle from is low
    args.rates_mbit = args.rates_mbit or ([1000.0] if reproduce else [10000.0, 1000.0, 100.0])
    args.steps = args.steps or (8 if reproduce else 10)
    args.out = args.out or Path(
        "runs/steptime.json" if reproduce else "results/bench/megatron_step.json"
    )
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps {args.steps} and --warmup {args.warmup} must be >= 1 "
                     "(SCAPE's first step is its dense warm-up)")  # fmt: skip
    if any(w < 2 for w in args.worlds):
        parser.error(f"--worlds {args.worlds}: every rank count must be >= 2")
    protocol = quiet.protocol_from_args(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # teardown runs on a killed make
    args.out.parent.mkdir(parents=True, exist_ok=True)
    bench = f"megatron_step --suite {args.suite}"
    if not args.loopback and not ready_or_skip(bench, args.out):
        return 0
    try:
        quiet.require_quiet(bench, protocol.allow_busy)
    except SystemExit as refusal:
        if args.on_busy == "error":
            raise
        print(f"{refusal} -- SKIPPED")
        args.out.write_text(json.dumps({"skipped": f"the machine was busy: {refusal}"}, indent=1))
        return 0
    if reproduce:  # a run that dies must not leave an older run's step times for the table
        args.out.write_text(json.dumps({"skipped": "the step-time benchmark did not finish "
                                        "(see its output)"}, indent=1))  # fmt: skip
    rounds_plan = plan_rounds(args.suite, args.worlds, args.rates_mbit)
    with tempfile.TemporaryDirectory(prefix="scape-step-bench-") as tmp_name:
        tmp = Path(tmp_name)
        methods_by_world = {w: methods_for(args.suite, w, args.data_root.resolve(), tmp / "runs",
                                           args.model_overrides, args.methods)
                            for w in args.worlds}  # fmt: skip
        prepare_data(methods_by_world)
        settings = {"suite": args.suite, "rounds": rounds_plan, "steps": args.steps,
                    "warmup": args.warmup, "loopback": args.loopback,
                    "shared_process": args.shared_process,
                    "methods": {str(w): [m["overrides"] for m in ms]
                                for w, ms in methods_by_world.items()}}  # fmt: skip
        settings_clean = json.loads(json.dumps(settings).replace(str(tmp), "<tmp>"))
        fp = fingerprint(settings_clean)
        kept, started = _resumable(args.out, fp, args.fresh, args.rerun_noisy)
        doc: dict[str, Any] = {
            "bench": "megatron_step", "suite": args.suite,
            "mode": "loopback" if args.loopback else "netns",
            "fingerprint": fp, "settings": settings_clean, "protocol": protocol.to_dict(),
            "bench_model": BENCH_MODEL if not reproduce else None,
            "world_size": args.worlds[0], "link": {"label": LinkSpec(args.rates_mbit[0]).label,
                                                   "rate_mbit": args.rates_mbit[0]},
            "steps": args.steps, "warmup": args.warmup, "host": _host(),
            "started_at": started or time.strftime("%Y-%m-%d %H:%M:%S %Z"), "complete": False,
            "rounds": dict(kept), "not_run": [],
        }  # fmt: skip
        if kept:
            doc["resumed_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            print(f"resuming a run: keeping rounds {', '.join(kept)}", flush=True)
        deadline = time.monotonic() + args.budget_min * 60
        for i, rnd in enumerate(rounds_plan, 1):
            if rnd["name"] in kept:
                continue
            if time.monotonic() > deadline:
                doc["not_run"].append(
                    {"round": rnd["name"], "why": f"time budget ({args.budget_min:g} min)"}
                )
                continue
            where = "loopback" if args.loopback else LinkSpec(rnd["rate_mbit"]).label
            how = ("interleaved in one launch" if args.shared_process
                   else "each in its own launches, 2 passes")  # fmt: skip
            how += ", each beside its floor" if rnd.get("floor") else ""
            print(f"== round {i}/{len(rounds_plan)} {rnd['name']}: {rnd['world_size']} ranks, "
                  f"{where}, {len(methods_by_world[rnd['world_size']])} methods {how}, "
                  f"{args.warmup}+{args.steps} steps", flush=True)  # fmt: skip
            attempt = [0]
            record = quiet.run_round(
                rnd["name"],
                lambda rnd=rnd, attempt=attempt: run_round_once(
                    rnd, methods_by_world[rnd["world_size"]], args, tmp, attempt),
                protocol, deadline=deadline,
            )  # fmt: skip
            doc["rounds"][rnd["name"]] = record
            for name, m in record.get("methods", {}).items():
                print(f"   {name:40s} {m['step_s'] * 1e3:8.1f} ms "
                      f"[{m['step_s_p25'] * 1e3:.0f}-{m['step_s_p75'] * 1e3:.0f}]  "
                      f"{m['bytes_per_rank_total'] / 1e3:10,.1f} kB/rank", flush=True)  # fmt: skip
            _write(doc, args.out, methods_by_world)
    doc["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    doc["complete"] = not doc["not_run"] and all("error" not in r for r in doc["rounds"].values())
    if args.loopback and reproduce:
        doc["skipped"] = "loopback run: not a speed measure (points kept as loopback_points)"
    _write(doc, args.out, methods_by_world)
    print(
        f"wrote {args.out}" + ("" if doc["complete"] else " (incomplete: run it again to resume)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
