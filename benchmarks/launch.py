"""Start one rank process per namespace (or on loopback) and collect what each wrote.

``scape.spawn.run_distributed`` spawns ranks from the parent's namespace; here every
rank must start *inside* its own namespace, so each is a fresh ``python -m <module>``
under ``ip netns exec``. A rank reads its JSON spec, joins the gloo group at rank 0's
address over its namespace's interface, and writes ``rank<r>.json`` to ``out_dir``.
On any failure or timeout every rank's process group is killed (by the ids we started)
and the error carries the log tails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.netns import Cluster
from scape.spawn import find_free_port

__all__ = ["LaunchError", "error_summary", "launch_ranks"]

PORT_IN_NAMESPACE = 29511  # fresh namespaces: nothing else listens there


class LaunchError(RuntimeError):
    pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def launch_ranks(
    module: str,
    spec: dict[str, Any],
    out_dir: Path,
    *,
    world_size: int,
    cluster: Cluster | None = None,
    timeout_s: float = 600.0,
) -> list[dict[str, Any]]:
    """Run ``python -m module --spec <json> --rank r`` for every rank; return their results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if cluster is not None:
        master, port, ifname = cluster.addrs[0], PORT_IN_NAMESPACE, cluster.ifname
    else:
        master, port, ifname = "127.0.0.1", find_free_port(), "lo"
    spec = {**spec, "world_size": world_size, "master_addr": master, "master_port": port,
            "ifname": ifname, "out_dir": str(out_dir)}  # fmt: skip
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": ifname,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
    procs: list[subprocess.Popen] = []
    logs = [out_dir / f"rank{r}.log" for r in range(world_size)]
    try:
        for r in range(world_size):
            argv = [sys.executable, "-m", module, "--spec", str(spec_path), "--rank", str(r)]
            if cluster is not None:
                argv = cluster.exec_argv(r, argv)
            with open(logs[r], "w") as log:
                procs.append(
                    subprocess.Popen(
                        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )  # fmt: skip
                )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                r = failed[0]
                raise LaunchError(f"rank {r} exited with {procs[r].returncode}:\n{_tail(logs[r])}")
            if time.monotonic() > deadline:
                raise LaunchError(f"ranks still running after {timeout_s:.0f}s:\n{_tail(logs[0])}")
            time.sleep(0.2)
        for r, p in enumerate(procs):
            if p.returncode != 0:
                raise LaunchError(f"rank {r} exited with {p.returncode}:\n{_tail(logs[r])}")
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
        hits = [ln.strip() for ln in log if _ERROR_LINE.search(ln)]
        if hits:
            lines.append(f"rank {r}: {hits[-1][:400]}")
    return "\n".join(lines)
