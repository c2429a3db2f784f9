"""The quiet-machine protocol of every timing benchmark (on a shared machine, timings are mostly
other jobs' time): refuse to start beside a study, the tests or another benchmark
(:func:`require_quiet`); per round (:func:`run_round`) wait for the load to settle, record the
load, other processes' CPU and a host speed probe, re-run a disturbed round at most ``retries``
times, then keep it marked ``noisy``. The load *after* a round includes our own ranks: shown,
not judged.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.training.provenance import git_version

__all__ = ["BUSY_PATTERNS", "Protocol", "busy_processes", "commit", "host", "host_speed_ms",
           "load_average", "other_cpu_seconds", "require_quiet", "run_round", "utc_now"]  # fmt: skip

PROC = Path("/proc")
# Command lines that must not run beside a benchmark (a regex over the joined argv).
BUSY_PATTERNS = (r"pipelines\.(quality_study|peers_study|reproduce|pretrain)\b", r"\bpytest\b",
                 r"-m benchmarks\.", r"make (bench|test|reproduce-table|quality-study|peers-study)")  # fmt: skip
_PF_KTHREAD = 0x00200000
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def load_average(path: Path = PROC / "loadavg") -> float:  # the 1-minute one
    return float(path.read_text().split()[0])


def _read(pid: int, name: str) -> str | None:
    try:
        return (PROC / str(pid) / name).read_bytes().decode(errors="replace")
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    return (_read(pid, "cmdline") or "").replace("\0", " ").strip()


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state, 1 = ppid)."""
    text = _read(pid, "stat")
    return None if text is None else text[text.rfind(")") + 2 :].split()


def _own_tree() -> set[int]:
    """This process, its ancestors (the shell, make) and everything it started."""
    parents = {pid: int(f[1]) for pid in map(int, filter(str.isdigit, os.listdir(PROC)))
               if (f := _stat(pid)) is not None}  # fmt: skip
    own, pid = set(), os.getpid()
    while pid > 1 and pid in parents:
        own.add(pid)
        pid = parents[pid]
    frontier = {os.getpid()}
    while frontier:
        frontier = {c for c, parent in parents.items() if parent in frontier} - own
        own |= frontier
    return own


def _others() -> list[tuple[int, list[str]]]:
    """(pid, stat fields) of every process outside this one's tree."""
    own = _own_tree()
    return [(pid, f) for pid in map(int, filter(str.isdigit, os.listdir(PROC)))
            if pid not in own and (f := _stat(pid)) is not None]  # fmt: skip


def busy_processes(patterns: tuple[str, ...] = BUSY_PATTERNS) -> list[tuple[int, str]]:
    """(pid, command line) of studies, tests and benchmarks outside our tree (BUSY_PATTERNS);
    stopped (SIGSTOP) and zombie processes use no CPU and do not count."""
    regex = re.compile("|".join(patterns))
    return [(pid, cmd) for pid, f in _others() if f[0] not in ("T", "t", "Z", "X")
            and regex.search(cmd := _cmdline(pid))]  # fmt: skip


def require_quiet(bench: str, allow_busy: bool) -> list[tuple[int, str]]:
    """Exit with one line naming what runs beside us, unless ``allow_busy``; returns it."""
    busy = busy_processes()
    if busy and not allow_busy:
        (pid, cmd), more = busy[0], f" and {len(busy) - 1} more" if len(busy) > 1 else ""
        raise SystemExit(f"{bench}: refusing to time beside pid {pid} ({cmd[:120]}){more}: stop "
                         "it and run again, or pass --allow-busy (ALLOW_BUSY=1 for make) to run "
                         "anyway with disturbed rounds marked noisy")  # fmt: skip
    if busy:
        print(f"{bench}: running beside {len(busy)} busy process(es) (--allow-busy); "
              f"first: pid {busy[0][0]} {busy[0][1][:100]}", flush=True)  # fmt: skip
    return busy


def other_cpu_seconds() -> dict[int, tuple[str, float]]:
    """pid -> (start time, CPU seconds so far) of every user-space process outside our tree."""
    # after the name: state(0) ppid(1) ... flags(6) ... utime(11) stime(12) ... start(19)
    return {pid: (f[19], (int(f[11]) + int(f[12])) / _CLK_TCK) for pid, f in _others()
            if not int(f[6]) & _PF_KTHREAD}  # fmt: skip


def _other_cores(before: dict[int, tuple[str, float]], wall_s: float) -> float:
    """Cores other processes used on average since ``before`` (those alive now)."""
    used = sum(cpu - before[pid][1] if pid in before and before[pid][0] == start else cpu
               for pid, (start, cpu) in other_cpu_seconds().items())  # fmt: skip
    return used / wall_s if wall_s > 0 else 0.0


def host_speed_ms(reps: int = 3) -> float:
    """Milliseconds of a fixed one-thread workload, memory- and compute-bound like the steps
    (median of ``reps`` after a warm-up): a change is a change of the host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x, a = torch.ones(1 << 22), torch.full((256, 256), 0.5)
        y, times = torch.empty_like(x), []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            for _ in range(8):
                torch.add(x, x, alpha=0.5, out=y)
                torch.mm(a, a)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return sorted(times[1:])[reps // 2] * 1e3


@dataclass(frozen=True)
class Protocol:
    max_load: float = 1.5  # 1-min load above which a round is re-run
    max_other_cores: float = 0.25  # other processes' average cores above which it is re-run
    retries: int = 2  # re-runs of a disturbed round before it is kept as noisy
    # the 1-min load is an exponential average: after a 4-rank round on 2 cores it takes
    # about 2 minutes to fall back to max_load
    settle_s: float = 240.0
    allow_busy: bool = False
    load_fn: Callable[[], float] = field(default=load_average, repr=False, compare=False)
    sleep_fn: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    probe_fn: Callable[[], float] = field(default=host_speed_ms, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.endswith("_fn")}

    def settle(self) -> tuple[float, float]:
        """Wait until the 1-min load is at most ``max_load`` or ``settle_s`` passed: (load, wait)."""
        start, load = time.monotonic(), self.load_fn()
        while load > self.max_load and time.monotonic() - start < self.settle_s:
            self.sleep_fn(min(5.0, self.settle_s))
            load = self.load_fn()
        return load, time.monotonic() - start


def run_round(name: str, fn: Callable[[], dict[str, Any]], protocol: Protocol,
              deadline: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``fn`` (one round, returning its JSON record) under the protocol: the last attempt's
    record plus ``quiet`` (every attempt's readings; ``noisy``). No re-run after ``deadline``."""
    p, attempts = protocol, []
    for attempt in range(p.retries + 1):
        load_before, waited = p.settle()
        probe_before, cpu_before, t0 = p.probe_fn(), other_cpu_seconds(), time.perf_counter()
        record = fn()
        wall = time.perf_counter() - t0
        other, load_after, probe_after = _other_cores(cpu_before, wall), p.load_fn(), p.probe_fn()
        reasons = []
        if load_before > p.max_load:
            reasons.append(f"1-min load {load_before:.2f} > {p.max_load} before the round")
        if other > p.max_other_cores:
            reasons.append(f"other processes used {other:.2f} cores while it ran (> {p.max_other_cores})")  # fmt: skip
        attempts.append({"attempt": attempt + 1, "load_before": load_before, "load_after": load_after,
                         "other_cores": other, "settle_wait_s": waited, "seconds": wall,
                         "host_ms_before": probe_before, "host_ms_after": probe_after,
                         "disturbed": "; ".join(reasons) or None})  # fmt: skip
        print(f"   [{name}] try {attempt + 1}: load {load_before:.2f} -> {load_after:.2f}, other "
              f"processes {other:.2f} cores, host probe {probe_before:.0f} -> {probe_after:.0f} ms, "
              f"{wall:.0f} s: {attempts[-1]['disturbed'] or 'quiet'}", flush=True)  # fmt: skip
        if not reasons or (deadline is not None and time.monotonic() > deadline):
            break
    last = attempts[-1]
    record["quiet"] = {"attempts": attempts, **{k: last[k] for k in ("load_before", "load_after",
                       "other_cores", "host_ms_before", "host_ms_after")},
                       "noisy": last["disturbed"] is not None, "noisy_reason": last["disturbed"]}  # fmt: skip
    return record


def host() -> dict[str, Any]:
    """What the timings ran on, for the record beside them."""
    import platform

    import torch

    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "machine": platform.machine()}  # fmt: skip


def commit() -> str | None:
    """The checkout's short commit, for the record beside the timings."""
    return (git_version()["commit"] or "")[:7] or None


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
