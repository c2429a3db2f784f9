"""One rank of a multi-rank benchmark: ``python -m benchmarks.rank_main --spec S --rank R``.

Started by :func:`benchmarks.launch.launch_ranks`, inside the rank's namespace or on
loopback. It joins the gloo group, optionally times a sweep of bare collectives (the
cost model's calibration), then trains every method of the spec on the same model and
data, **alternating** methods step by step (rotating the order each round) so that
drifts in machine load hit all methods alike. Writes ``rank<R>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.compute import LlamaShape, TinyLlama, batch_for
from benchmarks.ring import RingCommunicator, ring_reduce_scatter
from benchmarks.workloads import FlatModel, HParams, MethodSpec, build_method
from scape.comm import SparseCommunicator


def _tx_bytes(ifname: str) -> int | None:
    """Bytes this namespace's interface has sent (None on loopback: lo is shared)."""
    if ifname == "lo":
        return None
    try:
        return int(Path(f"/sys/class/net/{ifname}/statistics/tx_bytes").read_text())
    except OSError:
        return None


def calibrate(sizes: list[int], reps: int, ifname: str) -> list[dict[str, Any]]:
    """Time bare collectives of ``nbytes`` total (fp32), each ``reps`` times after a warm-up.

    ``reduce_scatter`` is the p2p ring the workloads use; ``reduce_scatter_native`` is
    gloo's own (about twice the ring's bytes); ``all_gather`` is gloo's (a ring).
    """
    world = dist.get_world_size()
    out = []
    for nbytes in sizes:
        n = max(world, nbytes // 4 // world * world)
        full, part = torch.randn(n), torch.empty(n // world)
        for op in ("reduce_scatter", "reduce_scatter_native", "all_gather"):
            times, tx = [], []
            for _ in range(reps + 1):  # the first is a warm-up
                dist.barrier()
                tx0, t0 = _tx_bytes(ifname), time.perf_counter()
                if op == "reduce_scatter":
                    ring_reduce_scatter(part, full)
                elif op == "reduce_scatter_native":
                    dist.reduce_scatter_tensor(part, full)
                else:
                    dist.all_gather_into_tensor(full, part)
                times.append(time.perf_counter() - t0)
                tx1 = _tx_bytes(ifname)
                tx.append(None if tx0 is None else tx1 - tx0)
            out.append({"op": op, "nbytes": n * 4, "times": times[1:], "tx_bytes": tx[1:]})
    return out


def _flat_methods(spec: dict[str, Any], shape: LlamaShape, world: int) -> tuple[list, dict]:
    """The communicator-level workload: one model, a flat buffer per method."""
    flat = FlatModel(TinyLlama(shape, seed=spec.get("seed", 0)), lambda m, batch: m(batch), world)
    comm = (
        RingCommunicator() if spec.get("reduce_scatter", "ring") == "ring" else SparseCommunicator()
    )
    hp = HParams(**spec.get("hparams", {}))
    methods = [build_method(MethodSpec.from_dict(m), flat, comm, hp) for m in spec["methods"]]
    sizes = {"n_params": shape.num_params(), "padded": flat.layout.total,
             "shard_size": flat.shard_size}  # fmt: skip
    return methods, sizes


def _megatron_methods(spec: dict[str, Any], shape: LlamaShape, world: int) -> tuple[list, dict]:
    """Megatron's train step (dense baselines; SCAPE when the adapter is present)."""
    from benchmarks.megatron_workload import CollectiveTap, MegatronMethod
    from scape.megatron.dense import init_megatron

    init_megatron(spec.get("seed", 0) + 1234)
    tap = CollectiveTap(ring=spec.get("reduce_scatter", "ring") == "ring")
    methods = [MegatronMethod(MethodSpec.from_dict(m), shape, tap, spec.get("seed", 0))
               for m in spec["methods"]]  # fmt: skip
    padded = methods[0].ddp.buffers[0].grad_data.numel()
    n = sum(p.numel() for p in methods[0].ddp.module.parameters())
    return methods, {"n_params": n, "padded": padded, "shard_size": padded // world}


def train(spec: dict[str, Any], ifname: str) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = LlamaShape(**spec["model"])
    build = _megatron_methods if spec.get("workload") == "megatron" else _flat_methods
    methods, sizes = build(spec, shape, world)
    warmup, rounds = spec["warmup"], spec["rounds"]
    records = []
    for i in range(warmup + rounds):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for method in order:
            batch = batch_for(shape, rank=rank, step=i, world_size=world)
            dist.barrier()
            tx0, t0 = _tx_bytes(ifname), time.perf_counter()
            rec = method.step(i + 1, batch)
            wall = time.perf_counter() - t0
            tx1 = _tx_bytes(ifname)
            row = rec.to_dict()
            row.update(wall=wall, measured=i >= warmup,
                       tx_bytes=None if tx0 is None else tx1 - tx0)  # fmt: skip
            records.append(row)
    return {**sizes, "workload": spec.get("workload", "comm"), "steps": records}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
    init = f"tcp://{spec['master_addr']}:{spec['master_port']}"
    dist.init_process_group("gloo", init_method=init, rank=args.rank,
                            world_size=spec["world_size"],
                            timeout=timedelta(seconds=spec.get("timeout_s", 300)))  # fmt: skip
    try:
        result: dict[str, Any] = {"rank": args.rank}
        cal = spec.get("calibrate")
        if cal:
            result["calibration"] = calibrate(cal["sizes"], cal["reps"], spec["ifname"])
        if spec.get("methods"):
            result.update(train(spec, spec["ifname"]))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    out = Path(spec["out_dir"]) / f"rank{args.rank}.json"
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
