"""The rank workers of the pretrain-stage benchmarks, run by :func:`benchmarks.harness.launch.main`.

:func:`step_worker` (``make bench-step``): every method of the spec is a pretrain-stage
configuration (``overrides`` as on ``python -m pipelines.pretrain``'s command line). The rank
builds each one's engine with the stage's own :func:`pipelines.training.engine.build_engine`,
its lr schedule with the trainer's, feeds it the trainer's data, and times ``engine.step``
-- the call whose wall time the trainer logs as ``step_time`` -- a barrier before each.
Over gloo (the emulated links) it reads the interface's sent bytes around each step and,
with ``time_calls``, then times the method's own collectives bare at the sizes its step
sent (what the cost model books them at). In the ``fake`` group (the compute-only floor:
every collective returns at once, locally) it also times forward and backward alone.
Nothing here depends on how SCAPE's step works inside.

:func:`pretrain_worker` (``make bench-peers-cluster``): the pretrain stage's trainer,
unchanged, in a fresh run directory; rank 0 returns its per-step ``step_time``, bytes and
loss read back from ``metrics.jsonl``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.harness.netns import tx_bytes

__all__ = ["pretrain_worker", "read_steps", "step_calls", "step_worker", "time_collectives"]

FWD_BWD_REPS = 3
COLLECTIVES = ("reduce_scatter", "all_gather", "all_reduce")


def time_collectives(calls: list[tuple[str, int]], reps: int) -> list[list[float]]:
    """Seconds of bare gloo collectives, each ``(op, tensor bytes)``, after one warm-up."""
    world = dist.get_world_size()
    out = []
    for op, nbytes in calls:
        if op not in COLLECTIVES:
            raise ValueError(f"unknown collective {op!r}: use one of {COLLECTIVES}")
        n = max(world, nbytes // 4 // world * world)
        full, part = torch.randn(n), torch.empty(n // world)
        times = []
        for _ in range(reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if op == "reduce_scatter":
                dist.reduce_scatter_tensor(part, full)
            elif op == "all_gather":
                dist.all_gather_into_tensor(full, part)
            else:
                dist.all_reduce(full)
            times.append(time.perf_counter() - t0)
        out.append(times[1:])
    return out


def step_calls(info: dict[str, Any], counted: dict[str, float], world: int) -> list[dict]:
    """One collective of each kind a method makes per step, at its own size (tensor bytes),
    from the bytes its engine counted for a step (a ring's (W-1)/W of each tensor, summed
    over calls): SCAPE's values all-reduce (booked half as gradient, half as parameter
    values) and its one mask all-gather; dense's gradient reduce-scatter and parameter
    all-gather (one per bucket)."""
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


def _method_info(cfg, ddp, world: int) -> dict[str, Any]:
    scape = cfg.optimizer.scape if cfg.optimizer.name == "scape" else None
    buckets = sum(len(g.buckets) for g in ddp.bucket_groups)
    return {"label": cfg.optimizer.label, "optimizer": cfg.optimizer.name,
            "model": cfg.model.name, "n_params": sum(p.numel() for p in ddp.module.parameters()),
            "buckets": buckets, "overlap_grad_reduce": bool(cfg.train.overlap_grad_reduce),
            "values_in_grad_sync": scape is not None,
            "value_collectives": 1 if scape and scape.fuse_buckets else buckets,
            "tokens_per_rank_step": cfg.train.global_batch_size // world * cfg.model.seq_length}  # fmt: skip


def step_worker(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Time ``engine.step`` of each method in the spec (interleaved step by step when there
    are several); see the module docstring."""
    from pipelines.training.config import compose
    from pipelines.training.data import load_training_data
    from pipelines.training.engine import build_engine
    from pipelines.training.trainer import _build_scheduler

    ifname = spec["ifname"] if spec["group"] == "gloo" else "lo"
    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    cfgs = {m["name"]: compose(m["overrides"]) for m in spec["methods"]}
    names = list(cfgs)
    engines = {n: build_engine(cfg, world) for n, cfg in cfgs.items()}
    schedulers = {n: _build_scheduler(engines[n].optimizer, cfg) for n, cfg in cfgs.items()}
    info = {n: _method_info(cfg, engines[n].ddp, world) for n, cfg in cfgs.items()}
    cfg0 = cfgs[names[0]]
    t = cfg0.train
    data = load_training_data(engines[names[0]].data_dir, seed=t.seed,
                              seq_length=cfg0.model.seq_length, world_size=world,
                              batch_per_rank=t.global_batch_size // world, steps=warmup + steps,
                              cache_dir=spec["cache_dir"])  # fmt: skip
    result: dict[str, Any] = {"methods": info, "steps": []}
    last_sent: dict[str, dict[str, float]] = {}
    profiler = None
    if spec.get("profile_parts"):  # SCAPE's named spans (record_function) over measured steps
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for step in range(warmup + steps):
        if profiler is not None and step == warmup:
            profiler.start()
        batches = data.rank_micro_batches(step, rank, t.micro_batch_size)
        k = step % len(names)
        for name in names[k:] + names[:k]:
            dist.barrier()
            schedulers[name].step(1)
            tx0 = tx_bytes(ifname)
            res = engines[name].step(batches)
            tx1 = tx_bytes(ifname)
            row = {"method": name, "step": step, "measured": step >= warmup,
                   "seconds": res.seconds, "tx_bytes": None if tx0 is None else tx1 - tx0}  # fmt: skip
            last_sent[name] = engines[name].bytes_last_step()
            if rank == 0:
                row.update(bytes=last_sent[name], loss=res.loss)
            result["steps"].append(row)
    if profiler is not None:
        profiler.stop()
        result["parts"] = {e.key: e.cpu_time_total / 1e6 / steps for e in profiler.key_averages()
                           if e.key.startswith("scape.")}  # fmt: skip
    if spec["group"] == "gloo" and spec.get("time_calls"):
        # gloo's CPU-bound collectives are not linear in size: time each at its own size
        result["calls"] = {}
        for name in names:
            wanted = step_calls(info[name], last_sent[name], world)
            times = time_collectives([(c["op"], c["nbytes"]) for c in wanted],
                                     int(spec["time_calls"]))  # fmt: skip
            result["calls"][name] = [{**c, "times": t} for c, t in zip(wanted, times, strict=True)]
    if spec["group"] == "fake":
        ref = next((n for n in names if cfgs[n].optimizer.name != "scape"), names[0])
        result["fwd_bwd"] = []
        for rep in range(FWD_BWD_REPS):
            dist.barrier()
            batches = data.rank_micro_batches(rep % (warmup + steps), rank, t.micro_batch_size)
            result["fwd_bwd"].append(_fwd_bwd(engines[ref], batches))
    return result


def read_steps(metrics_path: Path) -> dict[str, list]:
    """Per-step lists from a run's metrics.jsonl (records without ``step_time`` are skipped)."""
    from pipelines.training.tracking import read_metrics

    records = sorted((r for r in read_metrics(metrics_path) if "step_time" in r),
                     key=lambda r: int(r["step"]))  # fmt: skip
    return {"step": [int(r["step"]) for r in records],
            "step_time": [float(r["step_time"]) for r in records],
            "bytes": [float(sum((r.get("bytes") or {}).values())) for r in records],
            "bytes_by_kind": [r.get("bytes") or {} for r in records],
            "loss": [r.get("loss") for r in records]}  # fmt: skip


def pretrain_worker(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """One rank of the real pretrain stage (``overrides``, a fresh ``run_dir``: the trainer
    resumes from any checkpoint it finds there)."""
    from pipelines.training.config import compose
    from pipelines.training.runs import train_joined_rank
    from pipelines.training.tracking import METRICS_FILE

    start = time.perf_counter()
    cfg = compose(spec["overrides"])
    run_dir = Path(spec["run_dir"])
    summary = train_joined_rank(rank, world, cfg, run_dir)
    result: dict[str, Any] = {"status": summary.get("status"),
                              "seconds": time.perf_counter() - start}  # fmt: skip
    if rank == 0:
        result.update(optimizer=cfg.optimizer.name, label=cfg.optimizer.label,
                      model=cfg.model.name, train_seconds=summary.get("wall_clock_s_this_session"),
                      **read_steps(run_dir / METRICS_FILE))  # fmt: skip
    return result
