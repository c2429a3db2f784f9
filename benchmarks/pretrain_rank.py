"""One rank of the real pretrain stage, for :func:`benchmarks.launch.launch_ranks`.

    python -m benchmarks.pretrain_rank --spec S --rank R

Started inside the rank's network namespace (or on loopback). The spec holds ``overrides``
(pretrain overrides, as on ``python -m pipelines.pretrain``'s command line) and ``run_dir``
(a fresh directory: the trainer resumes from any checkpoint it finds there), plus what
``launch_ranks`` adds (``world_size``, ``master_addr``, ``master_port``, ``ifname``,
``out_dir``). The rank joins the gloo group over TCP, composes the config, runs
:func:`pipelines.training.trainer.train_rank` unchanged, and writes ``<out_dir>/rank<R>.json``: on
rank 0 the per-step ``step_time`` (forward + backward + communication + optimizer, as the
trainer measures it), the total bytes this rank sent each step and the loss, read back from
``metrics.jsonl``; on the other ranks only their rank and status.
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

__all__ = ["main", "read_steps"]


def read_steps(metrics_path: Path) -> dict[str, list]:
    """Per-step lists from a run's metrics.jsonl (records without ``step_time`` are skipped)."""
    from pipelines.training.tracking import read_metrics

    records = [r for r in read_metrics(metrics_path) if "step_time" in r]
    records.sort(key=lambda r: int(r["step"]))
    return {
        "step": [int(r["step"]) for r in records],
        "step_time": [float(r["step_time"]) for r in records],
        "bytes": [float(sum((r.get("bytes") or {}).values())) for r in records],
        "bytes_by_kind": [r.get("bytes") or {} for r in records],
        "loss": [r.get("loss") for r in records],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    spec: dict[str, Any] = json.loads(Path(args.spec).read_text())
    rank, world = args.rank, int(spec["world_size"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
    # Megatron and torch read these in places; keep them consistent with the TCP rendezvous.
    os.environ.update(MASTER_ADDR=spec["master_addr"], MASTER_PORT=str(spec["master_port"]),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")  # fmt: skip
    start = time.perf_counter()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{spec['master_addr']}:{spec['master_port']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=spec.get("timeout_s", 600)),
    )
    try:
        from pipelines.training.config import compose
        from pipelines.training.runs import train_joined_rank

        cfg = compose(spec["overrides"])
        run_dir = Path(spec["run_dir"])
        summary = train_joined_rank(rank, world, cfg, run_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    result: dict[str, Any] = {
        "rank": rank,
        "status": summary.get("status"),
        "seconds": time.perf_counter() - start,
    }
    if rank == 0:
        from pipelines.training.tracking import METRICS_FILE

        result.update(
            optimizer=cfg.optimizer.name,
            label=cfg.optimizer.label,
            model=cfg.model.name,
            train_seconds=summary.get("wall_clock_s_this_session"),
            **read_steps(run_dir / METRICS_FILE),
        )
    out = Path(spec["out_dir"]) / f"rank{rank}.json"
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
