"""The pretrain stage's step timer, a rank worker (``make bench-step``, ``bench-peers-cluster``):
``engine.step`` of one method with the stage's own engine, lr schedule and data, after a barrier;
over gloo also its collectives bare at its step's sizes, in the ``fake`` group (the compute-only
floor) its forward and backward.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.harness.records import Call, MethodSteps

__all__ = ["forward_backward", "prepare_data", "slowest_calls", "step_calls", "step_worker",
           "summarize", "time_collectives"]  # fmt: skip

FWD_BWD_REPS = 3


def time_collectives(calls: list[tuple[str, int]], reps: int) -> list[list[float]]:
    """Seconds of bare gloo collectives, each ``(op, tensor bytes)``, after one warm-up."""
    world = dist.get_world_size()
    ops = {"reduce_scatter": lambda full, part: dist.reduce_scatter_tensor(part, full),
           "all_gather": lambda full, part: dist.all_gather_into_tensor(full, part),
           "all_reduce": lambda full, part: dist.all_reduce(full)}  # fmt: skip
    out = []
    for op, nbytes in calls:
        if op not in ops:
            raise ValueError(f"unknown collective {op!r}: use one of {list(ops)}")
        n = max(world, nbytes // 4 // world * world)
        full, part, times = torch.randn(n), torch.empty(n // world), []
        for _ in range(reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            ops[op](full, part)
            times.append(time.perf_counter() - t0)
        out.append(times[1:])
    return out


def step_calls(info: dict[str, Any], counted: dict[str, float], world: int) -> list[dict]:
    """Each kind of collective a method makes per step at its tensor bytes, from the ring bytes
    counted: SCAPE's values all-reduce (booked half gradient, half parameter values) and mask
    all-gather; dense's reduce-scatter and all-gather."""
    if world <= 1:
        return []
    calls, whole = max(1, int(info["value_collectives"])), world / (world - 1)
    grad, param = counted.get("grad_values", 0.0), counted.get("param_values", 0.0)
    if info["values_in_grad_sync"]:
        kinds = [("values", "all_reduce", (grad + param) / calls * whole / 2),
                 ("masks", "all_gather", counted.get("masks", 0.0) * whole)]  # fmt: skip
    else:
        kinds = [("grad_values", "reduce_scatter", grad / calls * whole),
                 ("param_values", "all_gather", param / calls * whole)]  # fmt: skip
    return [{"kind": k, "op": op, "nbytes": int(round(n))} for k, op, n in kinds if n > 0]


def _fwd_bwd(engine, batches) -> tuple[float, float]:
    """Forward and backward seconds of one step's micro-batches, no gradient sync."""
    from scape.megatron.train import forward_loss

    ddp, fwd, bwd = engine.ddp, 0.0, 0.0
    ddp.zero_grad_buffer()
    with ddp.no_sync():
        for tokens, labels in batches:
            t0 = time.perf_counter()
            loss = forward_loss(ddp, tokens, labels) / len(batches)
            t1 = time.perf_counter()
            loss.backward()
            fwd, bwd = fwd + t1 - t0, bwd + time.perf_counter() - t1
    ddp.zero_grad_buffer()
    return fwd, bwd


def step_worker(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Time ``engine.step`` of the spec's one method (module docstring)."""
    from pipelines.training.config import compose
    from pipelines.training.data import load_training_data
    from pipelines.training.engine import build_engine
    from pipelines.training.trainer import _build_scheduler

    (method,) = spec["methods"]
    name, cfg, warmup, steps = method["name"], compose(method["overrides"]), spec["warmup"], spec["steps"]  # fmt: skip
    engine, t = build_engine(cfg), cfg.train
    scheduler, scape = _build_scheduler(engine.optimizer, cfg), cfg.optimizer.name == "scape"
    # Megatron's DDP has bucket groups; the peer baselines' torch DDP has none
    buckets = sum(len(g.buckets) for g in getattr(engine.ddp, "bucket_groups", []))
    info = {"label": cfg.optimizer.label, "optimizer": cfg.optimizer.name, "model": cfg.model.name,
            "n_params": sum(p.numel() for p in engine.ddp.module.parameters()),
            "buckets": buckets, "overlap_grad_reduce": bool(t.overlap_grad_reduce),
            "values_in_grad_sync": scape,
            "value_collectives": 1 if scape and cfg.optimizer.scape.fuse_buckets else buckets,
            "tokens_per_rank_step": t.global_batch_size // world * cfg.model.seq_length}  # fmt: skip
    data = load_training_data(engine.data_dir, seed=t.seed, seq_length=cfg.model.seq_length,
                              world_size=world, batch_per_rank=t.global_batch_size // world,
                              steps=warmup + steps, cache_dir=spec["cache_dir"])  # fmt: skip
    result: dict[str, Any] = {"methods": {name: info}, "steps": []}
    profiler = None
    if spec.get("profile_parts"):  # SCAPE's named spans (record_function) over measured steps
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for step in range(warmup + steps):
        if profiler is not None and step == warmup:
            profiler.start()
        batches = data.rank_micro_batches(step, rank, t.micro_batch_size)
        dist.barrier()
        scheduler.step(1)
        res = engine.step(batches)
        row = {"method": name, "step": step, "measured": step >= warmup, "seconds": res.seconds}
        sent = engine.bytes_last_step()
        result["steps"].append({**row, "bytes": sent, "loss": res.loss} if rank == 0 else row)
    if profiler is not None:
        profiler.stop()
        result["parts"] = {e.key: e.cpu_time_total / 1e6 / steps for e in profiler.key_averages()
                           if e.key.startswith("scape.")}  # fmt: skip
    if spec["group"] == "gloo" and spec.get("time_calls"):
        # gloo's CPU-bound collectives are not linear in size: time each at its own size
        wanted = step_calls(info, sent, world)
        times = time_collectives([(c["op"], c["nbytes"]) for c in wanted], int(spec["time_calls"]))
        result["calls"] = {name: [{**c, "times": ts} for c, ts in zip(wanted, times, strict=True)]}
    if spec["group"] == "fake":  # forward and backward alone, what the overlap hides behind
        result["fwd_bwd"] = []
        for rep in range(FWD_BWD_REPS):
            dist.barrier()
            batches = data.rank_micro_batches(rep % (warmup + steps), rank, t.micro_batch_size)
            result["fwd_bwd"].append(_fwd_bwd(engine, batches))
    return result


def prepare_data(overrides: list[str]) -> None:
    """Prepare the corpus a run of these overrides trains on, if it is not there yet."""
    from data_prep.config import PrepareConfig
    from data_prep.dataset import METADATA_FILE, prepared_dir
    from pipelines.prepare import run as prepare_run
    from pipelines.training.config import compose

    cfg = compose(overrides)
    if (prepared_dir(cfg.data_root, cfg.data.name, cfg.tokenizer.name) / METADATA_FILE).is_file():
        return
    print(f"preparing {cfg.data.name} with {cfg.tokenizer.name} in {cfg.data_root}", flush=True)
    prepare_run(PrepareConfig(data=cfg.data, tokenizer=cfg.tokenizer, output_root=cfg.data_root))


def summarize(results: list[dict[str, Any]]) -> dict[str, MethodSteps]:
    """Per method of a launch: each measured step at its slowest rank, rank 0's median bytes."""
    out = {}
    for name, info in results[0]["methods"].items():
        rows = [[r for r in res["steps"] if r["method"] == name and r["measured"]]
                for res in results]  # fmt: skip
        by_step = list(zip(*rows, strict=True))
        kinds = sorted({k for r in rows[0] for k in r["bytes"]})
        out[name] = MethodSteps(
            **info, step_s_all=[max(r["seconds"] for r in step) for step in by_step],
            bytes_per_rank={k: statistics.median(r["bytes"].get(k, 0.0) for r in rows[0])
                            for k in kinds},
            loss_last=rows[0][-1].get("loss") if rows[0] else None)  # fmt: skip
    return out


def slowest_calls(results: list[dict[str, Any]]) -> dict[str, list[Call]]:
    """Each method's timed collectives, every repetition at its slowest rank."""
    return {name: [Call(c["kind"], c["op"], c["nbytes"],
                        [max(res["calls"][name][i]["times"][j] for res in results)
                         for j in range(len(c["times"]))])
                   for i, c in enumerate(calls)]
            for name, calls in (results[0].get("calls") or {}).items()}  # fmt: skip


def forward_backward(results: list[dict[str, Any]]) -> tuple[float, float]:
    """A floor launch's forward and backward seconds: median over repetitions of the slowest."""
    reps = range(len(results[0]["fwd_bwd"]))
    return tuple(statistics.median(max(res["fwd_bwd"][i][part] for res in results) for i in reps)
                 for part in (0, 1))  # fmt: skip
