"""Machine-wide run slots: at most N local training runs at once, the rest wait their turn.

Sweeps through Hydra's submitit local launcher start every job at once (submitit's local
executor has no parallelism cap), and each job spawns ``cluster.world_size`` ranks; on a
small machine that oversubscribes the cores and every run crawls. Each local run therefore
holds one of ``cluster.max_concurrent`` advisory file locks under ``<output_root>/.slots/``
while it trains. The kernel drops a lock when its process dies, so a killed run never
leaks its slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["run_slot"]


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def run_slot(
    slot_dir: Path,
    slots: int,
    *,
    poll_s: float = 2.0,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[int]:
    """Hold one of ``slots`` locks in ``slot_dir`` for the duration of the block; yields its index."""
    if slots < 1:
        raise ValueError(f"slots={slots} must be >= 1 (cluster.max_concurrent)")
    slot_dir.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        for index in range(slots):
            fd = _try_lock(slot_dir / f"slot{index}.lock")
            if fd is not None:
                try:
                    yield index
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                return
        if on_wait is not None and not told:
            on_wait(
                f"all {slots} run slot(s) in {slot_dir} are busy (cluster.max_concurrent={slots}); "
                "waiting for a running job to finish"
            )
            told = True
        time.sleep(poll_s)
