"""One rank of the Megatron-step harness (:mod:`benchmarks.megatron_step`), for
:func:`benchmarks.launch.launch_ranks`:

    python -m benchmarks.step_rank --spec S --rank R

Every method of the spec is a pretrain-stage configuration (``overrides`` exactly as on
``python -m pipelines.pretrain``'s command line, e.g. ``optimizer=scape99``). The rank builds
each one's engine with the stage's own :func:`pipelines.training.engine.build_engine` (the
Megatron-Core model, DDP and dense or SCAPE optimizer the trainer uses), its lr schedule with
the trainer's, and feeds all of them the trainer's data for each step. Then it times
``engine.step`` -- the very call whose wall time the trainer logs as ``step_time`` --
for every method of the spec, **interleaved** step by step (the order rotated each step, a
barrier before each). The harness gives each launch one method by default, so that no
method runs in a process another has used. Nothing here depends on how
SCAPE's step works inside: a new step is measured as soon as the optimizer config builds it.

Two modes:

* ``cluster``: a gloo group over the rank's network namespace (or loopback). Before the
  steps it times bare gloo collectives of a few sizes (reduce-scatter, all-gather,
  all-reduce) for the alpha-beta fits; after them, each method's own collectives, bare, at
  the sizes its step sent (what the cost model times them by). It reads the interface's
  sent bytes around each step.
* ``floor``: the compute-only floor. The ranks run the same steps of the same methods, at
  the same time (so W ranks share this machine's cores as in ``cluster``), but in
  PyTorch's ``fake`` process group (``torch.testing._internal.distributed.fake_pg``): every
  collective returns at once, locally -- an all-gather fills its output with copies of this
  rank's input, a reduce-scatter hands back this rank's own chunk, an all-reduce leaves the
  tensor as it is. So the floor includes forward, backward, Megatron's bucket bookkeeping,
  SCAPE's selection, packing and decoding, the optimizer update and the local copies the
  collectives' outputs need, and excludes every transfer, every reduction across ranks and
  every wait for another rank. Set-up still needs real exchanges (Megatron's dataset
  builder waits on a barrier; SCAPE's optimizer all-gathers each rank's parameter groups),
  so ``barrier`` and ``all_gather_object`` go through a TCPStore; every timed step is
  preceded by such a barrier, keeping the ranks in step as collectives would. In this mode
  the rank also times forward and backward alone (the cost model hides gradient
  reduce-scatters behind backward when Megatron overlaps them).

Writes ``<out_dir>/rank<R>.json``: per step and method the seconds, the interface bytes
sent (``cluster`` in a namespace) and, on rank 0, the bytes by kind the engine counted and
the loss; the calibration and the per-method collective timings; per method the parameter
and bucket counts.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.netns import tx_bytes

__all__ = [
    "calibrate",
    "install_local_group",
    "main",
    "span_seconds",
    "step_calls",
    "time_collectives",
]

FWD_BWD_REPS = 3


def install_local_group(rank: int, world: int, addr: str, port: int, timeout_s: float) -> None:
    """The ``floor`` mode's process group: PyTorch's fake backend for every group (data
    collectives return at once, locally), with ``barrier`` and ``all_gather_object`` made
    real through a TCPStore (set-up needs them; they are never inside a timed step)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    store = dist.TCPStore(addr, port, world, rank == 0, timedelta(seconds=timeout_s))
    calls = [0]
    new_group = dist.new_group

    def fake_new_group(*args: Any, **kw: Any):  # Megatron asks for gloo side groups too
        kw.pop("backend", None)
        kw.pop("pg_options", None)
        return new_group(*args, **kw)

    def barrier(*_: Any, **__: Any) -> None:
        calls[0] += 1
        key = f"barrier/{calls[0]}"
        store.add(key, 1)
        while int(store.add(key, 0)) < world:
            time.sleep(0.001)

    def all_gather_object(out: list, obj: Any, group: Any = None) -> None:
        calls[0] += 1
        store.set(f"ago/{calls[0]}/{rank}", pickle.dumps(obj))
        for r in range(world):
            out[r] = pickle.loads(store.get(f"ago/{calls[0]}/{r}"))

    dist.new_group = fake_new_group
    dist.barrier = barrier
    dist.all_gather_object = all_gather_object


COLLECTIVES = ("reduce_scatter", "all_gather", "all_reduce")


def time_collectives(calls: list[tuple[str, int]], reps: int, ifname: str) -> list[dict[str, Any]]:
    """Seconds of bare gloo collectives, each ``(op, nbytes)`` after one warm-up: ``nbytes``
    is the fp32 tensor's size (a reduce-scatter's input, an all-gather's output, an
    all-reduce's tensor). An all-reduce is booked as its ring's reduce-scatter and all-gather
    together (twice the tensor), as the engines count its bytes, so one alpha-beta formula
    fits all three. ``cpu_times``: the CPU seconds this rank's process used in each call
    (every thread, gloo's included, user and system): where a collective is CPU-bound, hiding
    it behind compute on shared cores is not free (:func:`benchmarks.megatron_step.predict`)."""
    world = dist.get_world_size()
    out = []
    for op, nbytes in calls:
        if op not in COLLECTIVES:
            raise ValueError(f"unknown collective {op!r}: use one of {COLLECTIVES}")
        n = max(world, nbytes // 4 // world * world)
        full, part = torch.randn(n), torch.empty(n // world)
        times, cpu, tx = [], [], []
        for _ in range(reps + 1):
            dist.barrier()
            tx0, t0, c0 = tx_bytes(ifname), time.perf_counter(), time.process_time()
            if op == "reduce_scatter":
                dist.reduce_scatter_tensor(part, full)
            elif op == "all_gather":
                dist.all_gather_into_tensor(full, part)
            else:
                dist.all_reduce(full)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            tx1 = tx_bytes(ifname)
            tx.append(None if tx0 is None else tx1 - tx0)
        booked = n * 4 * (2 if op == "all_reduce" else 1)
        out.append({"op": op, "nbytes": booked, "times": times[1:], "cpu_times": cpu[1:],
                    "tx_bytes": tx[1:]})  # fmt: skip
    return out


def calibrate(sizes: list[int], reps: int, ifname: str) -> list[dict[str, Any]]:
    """The alpha-beta calibration: every collective at every size (tensor bytes)."""
    return time_collectives([(op, n) for n in sizes for op in COLLECTIVES], reps, ifname)


def step_calls(info: dict[str, Any], counted: dict[str, float], world: int) -> list[dict]:
    """One collective of each kind a method makes per step, at its own size, from the bytes
    its engine counted for a step (a ring's (W-1)/W of each tensor, summed over calls):
    SCAPE's value all-reduce (``values``: booked half as gradient, half as parameter values)
    and mask all-gather (once per step); dense's gradient reduce-scatter and parameter
    all-gather (one per bucket). Returns ``{"kind", "op", "nbytes"}`` with tensor bytes."""
    if world <= 1:
        return []
    calls = max(1, int(info.get("value_collectives") or info.get("buckets") or 1))
    whole = world / (world - 1)  # counted bytes -> tensor bytes
    if info.get("values_in_grad_sync"):
        values = counted.get("grad_values", 0.0) + counted.get("param_values", 0.0)
        kinds = [("values", "all_reduce", values / calls * whole / 2),
                 ("masks", "all_gather", counted.get("masks", 0.0) * whole)]  # fmt: skip
    else:
        kinds = [("grad_values", "reduce_scatter", counted.get("grad_values", 0.0) / calls * whole),
                 ("param_values", "all_gather", counted.get("param_values", 0.0) / calls * whole)]  # fmt: skip
    return [{"kind": k, "op": op, "nbytes": int(round(n))} for k, op, n in kinds if n > 0]


def span_seconds(profiler: torch.profiler.profile, prefix: str, steps: int) -> dict[str, float]:
    """Seconds per step in each ``record_function`` span whose name starts with ``prefix``
    (CPU time of the span, all its calls in the profiled steps, over ``steps``)."""
    return {e.key: e.cpu_time_total / 1e6 / steps for e in profiler.key_averages()
            if e.key.startswith(prefix)}  # fmt: skip


def _data_key(cfg) -> tuple:
    t = cfg.train
    return (cfg.data_root, cfg.data.name, cfg.tokenizer.name, cfg.model.seq_length,
            t.global_batch_size, t.micro_batch_size, t.seed)  # fmt: skip


def _fwd_bwd(engine, batches) -> tuple[float, float]:
    """Forward and backward seconds of one step's micro-batches, no gradient sync."""
    from scape.megatron.train import forward_loss

    ddp = engine.ddp
    ddp.zero_grad_buffer()
    fwd = bwd = 0.0
    with ddp.no_sync():
        for tokens, labels in batches:
            t0 = time.perf_counter()
            loss = forward_loss(ddp, tokens, labels) / len(batches)
            t1 = time.perf_counter()
            loss.backward()
            fwd, bwd = fwd + t1 - t0, bwd + time.perf_counter() - t1
    ddp.zero_grad_buffer()
    return fwd, bwd


def run(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    from pipelines.training.config import compose
    from pipelines.training.data import load_training_data
    from pipelines.training.engine import build_engine
    from pipelines.training.trainer import _build_scheduler

    world, mode = int(spec["world_size"]), spec["mode"]
    ifname = spec["ifname"] if mode == "cluster" else "lo"
    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    methods = spec["methods"]
    if spec.get("profile_parts") and len(methods) != 1:
        raise ValueError(f"profile_parts times one method per launch, got {len(methods)}")
    cfgs = {m["name"]: compose(m["overrides"]) for m in methods}
    keys = {name: _data_key(cfg) for name, cfg in cfgs.items()}
    if len(set(keys.values())) != 1:
        raise ValueError(f"methods must share data, sequence length and batch: {keys}")
    engines, schedulers, info = {}, {}, {}
    for name, cfg in cfgs.items():
        engines[name] = build_engine(cfg, world)
        schedulers[name] = _build_scheduler(engines[name].optimizer, cfg)
        ddp = engines[name].ddp
        scape = cfg.optimizer.scape if cfg.optimizer.name == "scape" else None
        buckets = sum(len(g.buckets) for g in ddp.bucket_groups)
        info[name] = {
            "label": cfg.optimizer.label,
            "optimizer": cfg.optimizer.name,
            "model": cfg.model.name,
            "n_params": sum(p.numel() for p in ddp.module.parameters()),
            "bucket_groups": len(ddp.bucket_groups),
            "buckets": buckets,
            "overlap_grad_reduce": bool(cfg.train.overlap_grad_reduce),
            # What the cost model needs of SCAPE's exchange: its values travel in all-reduces
            # started during backward (one per bucket, or one in all when fused); its masks in
            # one all-gather a step ahead of their use.
            "delay_mask": True if scape else None,
            "values_in_grad_sync": scape is not None,
            "value_collectives": 1 if scape and scape.fuse_buckets else buckets,
            "tokens_per_rank_step": cfg.train.global_batch_size // world * cfg.model.seq_length,
        }  # fmt: skip
    cfg0 = next(iter(cfgs.values()))
    t = cfg0.train
    data = load_training_data(
        engines[methods[0]["name"]].data_dir,
        seed=t.seed,
        seq_length=cfg0.model.seq_length,
        world_size=world,
        batch_per_rank=t.global_batch_size // world,
        steps=warmup + steps,
        cache_dir=spec["cache_dir"],
    )
    result: dict[str, Any] = {"rank": rank, "mode": mode, "methods": info, "steps": []}
    cal = spec.get("calibrate")
    if mode == "cluster" and cal:
        result["calibration"] = calibrate(cal["sizes"], cal["reps"], ifname)
    names = [m["name"] for m in methods]
    last_sent: dict[str, dict[str, float]] = {}  # method -> bytes by kind, its last step
    profiler = None
    if spec.get("profile_parts"):  # SCAPE's named spans over the measured steps
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
            sent = last_sent[name] = engines[name].bytes_last_step()
            if rank == 0:
                row.update(bytes=sent, loss=res.loss)
            result["steps"].append(row)
    if profiler is not None:
        profiler.stop()
        result["parts"] = span_seconds(profiler, "scape.", steps)
    if mode == "cluster" and spec.get("time_step_calls"):
        # each method's own collectives, bare, at the sizes its step just sent: gloo's
        # CPU-bound collectives are not linear in size, so the model times these
        result["step_calls"] = {}
        for name in names:
            wanted = step_calls(info[name], last_sent[name], world)
            timed = time_collectives([(c["op"], c["nbytes"]) for c in wanted],
                                     int(spec["time_step_calls"]), ifname)  # fmt: skip
            result["step_calls"][name] = [{"kind": c["kind"], "tensor_nbytes": c["nbytes"], **t}
                                          for c, t in zip(wanted, timed, strict=True)]  # fmt: skip
    if mode == "floor":
        ref = next((n for n in names if cfgs[n].optimizer.name != "scape"), names[0])
        result["fwd_bwd_method"] = ref
        result["fwd_bwd"] = []
        for rep in range(FWD_BWD_REPS):
            dist.barrier()
            batches = data.rank_micro_batches(rep % (warmup + steps), rank, t.micro_batch_size)
            result["fwd_bwd"].append(_fwd_bwd(engines[ref], batches))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    spec: dict[str, Any] = json.loads(Path(args.spec).read_text())
    rank, world = args.rank, int(spec["world_size"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    timeout = float(spec.get("timeout_s", 600))
    os.environ.update(MASTER_ADDR=spec["master_addr"], MASTER_PORT=str(spec["master_port"]),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")  # fmt: skip
    if spec["mode"] == "floor":
        install_local_group(rank, world, spec["master_addr"], int(spec["master_port"]), timeout)
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{spec['master_addr']}:{spec['master_port']}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout),
        )
    try:
        result = run(spec, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (Path(spec["out_dir"]) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
