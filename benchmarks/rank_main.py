"""One rank of the byte-count run: ``python -m benchmarks.rank_main --spec S --rank R``.

Started by :func:`benchmarks.launch.launch_ranks`, inside the rank's network namespace or on
loopback. It joins the gloo group, builds every method of the spec through Megatron's train
step (:mod:`benchmarks.megatron_workload`), steps them in turn on the same data, and writes
``rank<R>.json``: per step and method the bytes the method counted, the loss and (in a
namespace) the bytes the interface sent; the model's size and its buckets' shard sizes.
Nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.compute import LlamaShape, batch_for
from benchmarks.megatron_workload import CollectiveTap, MegatronMethod, MethodSpec
from benchmarks.netns import tx_bytes


def train(spec: dict[str, Any], ifname: str) -> dict[str, Any]:
    from scape.megatron.dense import init_megatron

    rank, world = dist.get_rank(), dist.get_world_size()
    shape = LlamaShape(**spec["model"])
    seed = spec.get("seed", 0)
    init_megatron(seed + 1234)
    tap = CollectiveTap()
    methods = [MegatronMethod(MethodSpec.from_dict(m), shape, tap,
                              bucket_size=spec.get("bucket_size"), seed=seed)
               for m in spec["methods"]]  # fmt: skip
    first = methods[0].ddp
    records = []
    for i in range(spec["warmup"] + spec["rounds"]):
        batch = batch_for(shape, rank=rank, step=i, world_size=world)
        for method in methods:
            dist.barrier()
            tx0 = tx_bytes(ifname)
            rec = method.step(i + 1, batch)
            tx1 = tx_bytes(ifname)
            row = rec.to_dict()
            row.update(measured=i >= spec["warmup"], tx_bytes=None if tx0 is None else tx1 - tx0)
            records.append(row)
    return {"n_params": sum(p.numel() for p in first.module.parameters()),
            "padded": first.buffers[0].grad_data.numel(),
            "shard_sizes": methods[0].shard_sizes(), "steps": records}  # fmt: skip


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
        result: dict[str, Any] = {"rank": args.rank, **train(spec, spec["ifname"])}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    out = Path(spec["out_dir"]) / f"rank{args.rank}.json"
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
