"""Rank processes: :func:`launch_ranks` starts ``python -m benchmarks.harness.launch`` once per
rank, inside its network namespace (``scape.spawn`` cannot start a rank *inside* one) or on
loopback; :func:`main` is every rank's skeleton. A failure or timeout kills every rank.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.harness.netns import Cluster
from scape.spawn import find_free_port

__all__ = ["LAUNCH_ERRORS", "LaunchError", "Worker", "error_summary", "launch_ranks", "main"]

Worker = Callable[[dict[str, Any], int, int], dict[str, Any]]  # (spec, rank, world) -> result


class LaunchError(RuntimeError):
    """A rank exited with an error or outlived the launch's timeout."""


LAUNCH_ERRORS = (LaunchError, OSError, ValueError, KeyError)  # a failed launch or its results


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def launch_ranks(worker: Worker, spec: dict[str, Any], out_dir: Path, *, world_size: int,
                 cluster: Cluster | None = None, group: str = "gloo",
                 timeout_s: float = 600.0) -> list[dict[str, Any]]:  # fmt: skip
    """Run ``worker(spec, rank, world)`` in one fresh process per rank; their results. ``group``:
    ``gloo`` (over the cluster's links, else loopback) or ``fake`` (:func:`install_fake_group`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if cluster is not None:
        # fresh namespaces: nothing else listens on a fixed port there
        master, port, ifname = cluster.addrs[0], 29511, cluster.ifname
    else:
        master, port, ifname = "127.0.0.1", find_free_port(), "lo"
    spec = {**spec, "worker": f"{worker.__module__}:{worker.__qualname__}", "group": group,
            "world_size": world_size, "master_addr": master, "master_port": port,
            "ifname": ifname, "out_dir": str(out_dir), "timeout_s": timeout_s}  # fmt: skip
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": ifname,
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    procs: list[subprocess.Popen] = []
    logs = [out_dir / f"rank{r}.log" for r in range(world_size)]
    try:
        for r in range(world_size):
            argv = [sys.executable, "-m", __name__, str(spec_path), str(r)]
            if cluster is not None:  # inside the rank's namespace
                argv = ["ip", "netns", "exec", cluster.rank_ns[r], *argv]
            with open(logs[r], "w") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if failed := [r for r, c in enumerate(codes) if c not in (None, 0)]:
                r = failed[0]
                raise LaunchError(f"rank {r} exited with {codes[r]}:\n{_tail(logs[r])}")
            if None not in codes:
                break
            if time.monotonic() > deadline:
                raise LaunchError(f"ranks still running after {timeout_s:.0f}s:\n{_tail(logs[0])}")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


_ERROR_LINE = re.compile(r"(Error|error:|what\(\)|Exception|Traceback|Killed)")


def error_summary(err: BaseException, out_dir: Path, world: int) -> str:
    """A failed launch's first line plus each rank log's last error-looking line."""
    lines = [str(err).splitlines()[0] if str(err) else type(err).__name__]
    for r in range(world):
        try:
            log = (out_dir / f"rank{r}.log").read_text(errors="replace").splitlines()
        except OSError:
            continue
        if hits := [ln.strip() for ln in log if _ERROR_LINE.search(ln)]:
            lines.append(f"rank {r}: {hits[-1][:400]}")
    return "\n".join(lines)


def install_fake_group(rank: int, world: int, addr: str, port: int, timeout_s: float) -> None:
    """The compute-only floor's process group: PyTorch's ``fake`` backend (data collectives
    return at once), with ``barrier`` and ``all_gather_object`` made real through a TCPStore:
    set-up needs them, and a barrier before every timed step keeps the ranks in step."""
    import torch.distributed as dist
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
        store.add(key := f"barrier/{calls[0]}", 1)
        while int(store.add(key, 0)) < world:
            time.sleep(0.001)

    def all_gather_object(out: list, obj: Any, group: Any = None) -> None:
        calls[0] += 1
        store.set(f"ago/{calls[0]}/{rank}", pickle.dumps(obj))
        for r in range(world):
            out[r] = pickle.loads(store.get(f"ago/{calls[0]}/{r}"))

    dist.new_group, dist.barrier = fake_new_group, barrier
    dist.all_gather_object = all_gather_object


def main(argv: list[str] | None = None) -> None:
    """One rank (``python -m benchmarks.harness.launch SPEC RANK``): process group, worker,
    barrier, ``rank<RANK>.json``."""
    import torch
    import torch.distributed as dist

    spec_path, rank = argv or sys.argv[1:]
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    rank, world, timeout = int(rank), int(spec["world_size"]), float(spec["timeout_s"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # Megatron and torch read these in places; keep them consistent with the rendezvous.
    os.environ.update(MASTER_ADDR=spec["master_addr"], MASTER_PORT=str(spec["master_port"]),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                      GLOO_SOCKET_IFNAME=spec["ifname"])  # fmt: skip
    if spec["group"] == "fake":
        install_fake_group(rank, world, spec["master_addr"], int(spec["master_port"]), timeout)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://{spec['master_addr']}:"
                                f"{spec['master_port']}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))  # fmt: skip
    module, name = spec["worker"].split(":")
    try:
        result = getattr(importlib.import_module(module), name)(spec, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (Path(spec["out_dir"]) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, **result}))


if __name__ == "__main__":
    main()
