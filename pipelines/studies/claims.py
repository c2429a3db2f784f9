"""Run claims: several study processes (workers) share one plan without running a run twice.

A worker runs a run only after creating ``<run_id>.jsonl.lock`` beside the run's log with
``O_EXCL`` (atomic on a local or NFS-v3+ file system), holding its host and pid, and removes it
when the run ends. A lock whose process is gone (a killed worker: this host, pid not alive)
is taken over; a lock of another host is respected, as its process cannot be checked from
here. Whoever claims an interrupted run next resumes it from its checkpoint, or redoes it
from scratch when it has none (:func:`.quality_run.train_run`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["claim", "held", "wait_for_others"]


def _lock(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / f"{run_id}.jsonl.lock"


def _alive(lock: Path) -> bool:
    """Whether the process that wrote ``lock`` may still be running."""
    try:
        host, pid = lock.read_text(encoding="utf-8").split()
    except (FileNotFoundError, ValueError):
        return False  # gone, or half-written by a process killed while writing it
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@contextmanager
def claim(runs_dir: Path, run_id: str) -> Iterator[bool]:
    """True when this process holds ``run_id``'s lock (created it, or took over a dead
    worker's) until the block ends; False when a live worker holds it."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(runs_dir, run_id)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _alive(lock):
                yield False
                return
            lock.unlink(missing_ok=True)  # a dead worker's: take it over
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
        try:
            yield True
        finally:
            lock.unlink(missing_ok=True)
        return
    yield False


def held(runs_dir: Path, run_ids: Iterable[str]) -> list[str]:
    """The runs of ``run_ids`` a live worker holds now."""
    return [r for r in run_ids if _lock(runs_dir, r).exists() and _alive(_lock(runs_dir, r))]


def wait_for_others(runs_dir: Path, run_ids: Iterable[str], poll_s: float = 15.0) -> None:
    """Block while other workers still run some of ``run_ids`` (the grids are extended from
    the finished runs, so every worker must see the same ones)."""
    ids = list(run_ids)
    said = False
    while busy := held(runs_dir, ids):
        if not said:
            print(f"waiting for {len(busy)} runs other workers hold ({busy[0]}, ...)", flush=True)
            said = True
        time.sleep(poll_s)
