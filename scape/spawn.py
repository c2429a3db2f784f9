"""Run a function on W spawned ranks joined by a real process group (gloo on CPU).

In the style of OLMo-core's ``run_distributed_test``: each rank is a fresh process (spawn,
not fork, so no state leaks from the parent), the group rendezvouses on a free local port,
each rank's stdout/stderr goes to its own log file, and the parent collects every rank's
return value or re-raises the first failure with that rank's traceback and log tail.
Tests, benchmarks and the pretrain stage's local launcher all use it.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["DistributedRunError", "find_free_port", "run_distributed"]


class DistributedRunError(RuntimeError):
    """A rank failed or timed out; the message carries its traceback and log tail."""


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    log_dir: str,
    env: dict[str, str],
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    results: Any,
) -> None:
    log_path = Path(log_dir) / f"rank{rank}.log"
    with open(log_path, "w", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        os.environ.update(env)
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
        )
        try:
            dist.init_process_group(
                backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
            )
            value = fn(rank, world_size, *args, **kwargs)
            # Plain pickle, not torch's shared-memory reductions: those hand the parent a
            # file descriptor that dies with this process.
            results.put((rank, True, pickle.dumps(value)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    log_dir: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    on_wait: Callable[[], None] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` spawned ranks.

    ``fn`` must be importable (module level). Returns the per-rank results in rank order.
    ``env`` is applied in each rank before the process group starts (e.g. ``GLOO_SOCKET_IFNAME``).
    ``on_wait`` is called about every 0.2 s while the ranks run (e.g. to draw progress).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    own_tmp = None
    if log_dir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="scape-dist-")
        log_dir = own_tmp.name
    os.makedirs(log_dir, exist_ok=True)
    port = find_free_port()
    base_env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    base_env.update(env or {})
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                r,
                world_size,
                port,
                backend,
                timeout_s,
                str(log_dir),
                base_env,
                fn,
                args,
                kwargs,
                results,
            ),
            daemon=False,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        collected: dict[int, Any] = {}
        failure: str | None = None
        deadline = time.monotonic() + timeout_s + 30
        last_poll = time.monotonic()
        while len(collected) < world_size and failure is None:
            if not results.empty():
                rank, ok, value = results.get()
                if ok:
                    collected[rank] = pickle.loads(value)
                else:
                    failure = f"rank {rank} failed:\n{value}\n--- rank {rank} log tail ---\n{_tail(Path(log_dir) / f'rank{rank}.log')}"
                continue
            dead = [
                r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in collected
            ]
            if dead:
                r = dead[0]
                failure = f"rank {r} exited with code {procs[r].exitcode}\n--- rank {r} log tail ---\n{_tail(Path(log_dir) / f'rank{r}.log')}"
            elif time.monotonic() > deadline:
                failure = f"timed out after {timeout_s:.0f}s; collected ranks {sorted(collected)}"
            else:
                time.sleep(0.02)
                if on_wait is not None and time.monotonic() - last_poll > 0.2:
                    on_wait()
                    last_poll = time.monotonic()
        if failure is not None:
            raise DistributedRunError(failure)
        for p in procs:
            p.join(timeout=30)
        return [collected[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        if own_tmp is not None:
            own_tmp.cleanup()
