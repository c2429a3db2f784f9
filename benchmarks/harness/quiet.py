"""The quiet-machine protocol every timing benchmark follows.

Timings on a shared machine are mostly other jobs' time, so every timing entry point:

1. refuses to start beside a study, the tests or another benchmark (:func:`require_quiet`
   scans ``/proc`` outside its own process tree), unless ``--allow-busy``;
2. runs in rounds (:func:`run_round`), each recorded with the 1-minute load average before
   and after it, the CPU that *other* processes used meanwhile, and a host speed probe
   (:func:`host_speed_ms`, a fixed one-thread workload: this virtual machine's speed
   drifts while the load average stays low). Before a round it waits (at most
   ``settle_s``) for the load to drop to ``max_load``; a round whose load before was higher,
   during which others used more than ``max_other_cores``, or which found itself disturbed,
   is re-run at most ``retries`` times, then kept and marked ``noisy`` with the reason.

The load *after* a round includes the benchmark's own ranks, so it is shown, not judged.
Other processes' CPU comes from ``/proc/<pid>/stat`` of user-space processes that are
neither this one, its ancestors nor its children (kernel threads are left out: they
include the network stack working for the benchmark itself).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BUSY_PATTERNS",
    "Protocol",
    "add_arguments",
    "busy_processes",
    "host_speed_ms",
    "load_average",
    "other_cpu_seconds",
    "protocol_from_args",
    "require_quiet",
    "run_round",
]

PROC = Path("/proc")
# Command lines that must not run beside a benchmark (a regex over the joined argv).
BUSY_PATTERNS = (
    r"pipelines\.(quality_study|peers_study|reproduce|pretrain)\b",
    r"\bpytest\b",
    r"-m benchmarks\.",
    r"make (bench|test|reproduce-table|quality-study|peers-study)",
)
_PF_KTHREAD = 0x00200000
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def load_average(path: Path = PROC / "loadavg") -> float:
    """The 1-minute load average."""
    return float(path.read_text().split()[0])


def _cmdline(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1:
        out.add(pid)
        fields = _stat(pid)
        if fields is None:
            break
        pid = int(fields[1])
    return out


def _descendants(pid: int, table: dict[int, int]) -> set[int]:
    out, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, parent in table.items() if parent in frontier} - out
        out |= frontier
    return out


def _own_tree() -> set[int]:
    """This process, its ancestors (the shell, make) and everything it started."""
    me = os.getpid()
    parents = {}
    for pid in _pids():
        fields = _stat(pid)
        if fields is not None:
            parents[pid] = int(fields[1])
    return _ancestors(me) | _descendants(me, parents)


def busy_processes(patterns: tuple[str, ...] = BUSY_PATTERNS) -> list[tuple[int, str]]:
    """(pid, command line) of processes outside this one's tree that a benchmark must not
    run beside: studies, pretraining, the tests, other benchmarks. Stopped (paused with
    SIGSTOP) and zombie processes use no CPU and do not count."""
    own = _own_tree()
    regex = re.compile("|".join(patterns))
    found = []
    for pid in _pids():
        fields = _stat(pid)
        if pid in own or fields is None or fields[0] in ("T", "t", "Z", "X"):
            continue
        cmd = _cmdline(pid)
        if cmd and regex.search(cmd):
            found.append((pid, cmd))
    return found


def require_quiet(bench: str, allow_busy: bool) -> list[tuple[int, str]]:
    """Exit with one line naming what runs beside us, unless ``allow_busy``; returns it."""
    busy = busy_processes()
    if busy and not allow_busy:
        pid, cmd = busy[0]
        more = f" and {len(busy) - 1} more" if len(busy) > 1 else ""
        raise SystemExit(
            f"{bench}: refusing to time beside pid {pid} ({cmd[:120]}){more}: stop it and "
            "run again, or pass --allow-busy (ALLOW_BUSY=1 for make) to run anyway with "
            "disturbed rounds marked noisy"
        )
    if busy:
        print(f"{bench}: running beside {len(busy)} busy process(es) (--allow-busy); "
              f"first: pid {busy[0][0]} {busy[0][1][:100]}", flush=True)  # fmt: skip
    return busy


def other_cpu_seconds() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of every user-space process outside our tree,
    keyed by pid, with the process start time (to tell a reused pid apart)."""
    own = _own_tree()
    out = {}
    for pid in _pids():
        if pid in own:
            continue
        fields = _stat(pid)
        if fields is None or int(fields[6]) & _PF_KTHREAD:
            continue
        # After the name: state(0) ppid(1) ... flags(6) ... utime(11) stime(12) ... start(19)
        out[pid] = (fields[19], (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    return out


def _other_cores(before: dict[int, tuple[str, float]], wall_s: float) -> float:
    """Cores other processes used on average since ``before`` (those alive now)."""
    after = other_cpu_seconds()
    used = 0.0
    for pid, (start, cpu) in after.items():
        prev = before.get(pid)
        used += cpu - prev[1] if prev and prev[0] == start else cpu  # else: started meanwhile
    return used / wall_s if wall_s > 0 else 0.0


def host_speed_ms(reps: int = 3) -> float:
    """Milliseconds of a fixed workload on one thread (median of ``reps`` after a warm-up):
    8 streaming adds over 16 MB (memory-bound, like the optimizers' passes) and 8 products
    of 256 x 256 matrices (compute-bound, like forward and backward). The same work every
    time, so a change in it is a change of the host, not of the benchmark."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x, a = torch.ones(1 << 22), torch.full((256, 256), 0.5)
        y = torch.empty_like(x)
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            for _ in range(8):
                torch.add(x, x, alpha=0.5, out=y)
                torch.mm(a, a)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    rest = sorted(times[1:])
    return rest[len(rest) // 2] * 1e3


@dataclass(frozen=True)
class Protocol:
    max_load: float = 1.5
    max_other_cores: float = 0.25
    retries: int = 2
    # the 1-min load is an exponential average: after a 4-rank round on 2 cores (load ~9)
    # it takes about 2 minutes to fall to 1.5 (90 s left the next 4-rank rounds noisy)
    settle_s: float = 240.0
    allow_busy: bool = False
    load_fn: Callable[[], float] = field(default=load_average, repr=False, compare=False)
    sleep_fn: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    probe_fn: Callable[[], float] = field(default=host_speed_ms, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for fn in ("load_fn", "sleep_fn", "probe_fn"):
            d.pop(fn)
        return d

    def settle(self) -> tuple[float, float]:
        """Wait until the 1-min load is at most ``max_load`` (or ``settle_s`` passed);
        returns (load, seconds waited)."""
        start = time.monotonic()
        load = self.load_fn()
        while load > self.max_load and time.monotonic() - start < self.settle_s:
            self.sleep_fn(min(5.0, self.settle_s))
            load = self.load_fn()
        return load, time.monotonic() - start


def run_round(name: str, fn: Callable[[], dict[str, Any]], protocol: Protocol,
              deadline: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``fn`` (one round, returning its JSON record) under the protocol; a record's own
    ``disturbed`` (a reason found in its figures) counts like load. Returns the last
    attempt's record plus ``quiet``: every attempt's load, other cores, probe and verdict,
    and ``noisy`` (with ``noisy_reason``). No re-run starts after ``deadline`` (monotonic)."""
    attempts: list[dict[str, Any]] = []
    record: dict[str, Any] = {}
    for attempt in range(protocol.retries + 1):
        load_before, waited = protocol.settle()
        probe_before = protocol.probe_fn()
        cpu_before, t0 = other_cpu_seconds(), time.perf_counter()
        record = fn()
        wall = time.perf_counter() - t0
        other = _other_cores(cpu_before, wall)
        load_after = protocol.load_fn()
        probe_after = protocol.probe_fn()
        reasons = []
        if load_before > protocol.max_load:
            reasons.append(f"1-min load {load_before:.2f} > {protocol.max_load} before the round")
        if other > protocol.max_other_cores:
            reasons.append(f"other processes used {other:.2f} cores while it ran "
                           f"(> {protocol.max_other_cores})")  # fmt: skip
        if record.get("disturbed"):  # what the round found in its own figures
            reasons.append(record["disturbed"])
        attempts.append({"attempt": attempt + 1, "load_before": load_before,
                         "load_after": load_after, "other_cores": other,
                         "settle_wait_s": waited, "seconds": wall,
                         "host_ms_before": probe_before, "host_ms_after": probe_after,
                         "disturbed": "; ".join(reasons) or None})  # fmt: skip
        verdict = "quiet" if not reasons else "disturbed: " + "; ".join(reasons)
        print(f"   [{name}] try {attempt + 1}: load {load_before:.2f} -> {load_after:.2f}, "
              f"other processes {other:.2f} cores, host probe {probe_before:.0f} -> "
              f"{probe_after:.0f} ms, {wall:.0f} s: {verdict}", flush=True)  # fmt: skip
        if not reasons:
            break
        if deadline is not None and time.monotonic() > deadline:
            print(f"   [{name}] no re-run: the benchmark's time budget is spent", flush=True)
            break
    last = attempts[-1]
    record["quiet"] = {"attempts": attempts, "load_before": last["load_before"],
                       "load_after": last["load_after"], "other_cores": last["other_cores"],
                       "host_ms_before": last["host_ms_before"],
                       "host_ms_after": last["host_ms_after"],
                       "noisy": last["disturbed"] is not None,
                       "noisy_reason": last["disturbed"]}  # fmt: skip
    return record


def host() -> dict[str, Any]:
    """What the timings ran on, for the record beside them."""
    import platform

    import torch

    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "machine": platform.machine()}  # fmt: skip


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The protocol's command-line options, the same for every benchmark."""
    g = parser.add_argument_group("quiet-machine protocol (benchmarks/harness/quiet.py)")
    g.add_argument("--allow-busy", action="store_true",
                   help="run beside studies/tests/benchmarks (disturbed rounds are marked noisy)")  # fmt: skip
    g.add_argument("--max-load", type=float, default=Protocol.max_load,
                   help="1-min load above which a round is re-run (default %(default)s)")  # fmt: skip
    g.add_argument("--max-other-cores", type=float, default=Protocol.max_other_cores,
                   help="other processes' average cores above which a round is re-run")  # fmt: skip
    g.add_argument("--retries", type=int, default=Protocol.retries,
                   help="re-runs of a disturbed round before it is kept as noisy")  # fmt: skip
    g.add_argument("--settle-s", type=float, default=Protocol.settle_s,
                   help="longest wait before a round for the load to drop")  # fmt: skip


def protocol_from_args(args: argparse.Namespace) -> Protocol:
    if args.retries < 0 or args.max_load <= 0 or args.settle_s < 0:
        raise SystemExit(
            f"quiet protocol: --retries {args.retries}, --max-load {args.max_load}, "
            f"--settle-s {args.settle_s}: need retries >= 0, max-load > 0, settle-s >= 0"
        )
    return Protocol(max_load=args.max_load, max_other_cores=args.max_other_cores,
                    retries=args.retries, settle_s=args.settle_s,
                    allow_busy=args.allow_busy)  # fmt: skip
