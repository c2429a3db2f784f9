"""The quiet-machine protocol: busy-process detection (real processes), other processes' CPU,
and the re-run / noisy logic of a round (load readings injected)."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from benchmarks.harness import cli, quiet
from benchmarks.harness.quiet import Protocol, run_round


def _detached(code: str, *argv: str) -> int:
    """Start ``python -c code argv...`` outside this process's tree (its shell parent exits)."""
    out = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "{code}" {" ".join(argv)} >/dev/null 2>&1 & echo $!'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.strip())


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _wait_for_cmdline(pid: int) -> None:
    for _ in range(100):
        if "sleep" in quiet._cmdline(pid) or "while" in quiet._cmdline(pid):
            return
        time.sleep(0.05)


def test_load_average_reads_the_first_field(tmp_path):
    path = tmp_path / "loadavg"
    path.write_text("2.47 1.10 0.80 3/200 12345\n")
    assert quiet.load_average(path) == 2.47


def test_a_study_outside_our_tree_blocks_a_benchmark_until_it_is_paused():
    pid = _detached("import time; time.sleep(60)", "pipelines.quality_study", "report=false")
    try:
        _wait_for_cmdline(pid)
        assert pid in [p for p, _ in quiet.busy_processes()]
        with pytest.raises(SystemExit, match=r"refusing to time beside pid \d+ .*--allow-busy"):
            # the first busy process named may be another real one on a shared machine
            quiet.require_quiet("bench-x", allow_busy=False)
        assert pid in [p for p, _ in quiet.require_quiet("bench-x", allow_busy=True)]
        os.kill(pid, signal.SIGSTOP)  # paused by the lead: no CPU, no longer in the way
        for _ in range(50):
            if quiet._stat(pid)[0] in ("T", "t"):
                break
            time.sleep(0.02)
        assert pid not in [p for p, _ in quiet.busy_processes()]
    finally:
        _kill(pid)


def test_our_own_children_are_neither_busy_nor_other_cpu():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass", "pipelines.quality_study"])
    try:
        _wait_for_cmdline(child.pid)
        time.sleep(0.3)
        assert child.pid not in [p for p, _ in quiet.busy_processes()]
        assert child.pid not in quiet.other_cpu_seconds()
    finally:
        child.kill()
        child.wait()


def test_other_processes_cpu_is_counted():
    pid = _detached("while True: pass")
    try:
        _wait_for_cmdline(pid)
        before = quiet.other_cpu_seconds()
        time.sleep(1.0)
        after = quiet.other_cpu_seconds()
        assert pid in before and after[pid][1] > before[pid][1]  # it burned CPU meanwhile
        assert quiet._other_cores(before, 1.0) >= after[pid][1] - before[pid][1] - 0.05
    finally:
        _kill(pid)


def _protocol(loads, probes=None, **kw):
    it, probe = iter(loads), iter(probes or [10.0] * 2 * len(loads))
    return Protocol(load_fn=lambda: next(it), sleep_fn=lambda s: None, settle_s=0.0,
                    max_other_cores=float("inf"), probe_fn=lambda: next(probe), **kw)  # fmt: skip


def test_the_host_probe_is_recorded_beside_each_try_but_does_not_judge_it():
    # a host twice as slow after the round as before it: shown, and the round kept
    rec = run_round("r", lambda: {}, _protocol([1.0, 1.2], probes=[40.0, 80.0]))
    q = rec["quiet"]
    assert (q["host_ms_before"], q["host_ms_after"]) == (40.0, 80.0) and not q["noisy"]
    assert q["attempts"][0]["host_ms_after"] == 80.0


def test_the_host_probe_times_a_fixed_workload_and_restores_the_threads():
    threads = torch.get_num_threads()
    ms = quiet.host_speed_ms(reps=1)
    assert 0 < ms < 60_000 and torch.get_num_threads() == threads


def test_a_round_with_high_load_before_is_rerun_then_kept():
    calls = []
    # attempt 1: load 3.0 before (disturbed), 2.0 after; attempt 2: 1.0 before, 1.8 after
    rec = run_round(
        "r", lambda: calls.append(1) or {"x": len(calls)}, _protocol([3.0, 2.0, 1.0, 1.8])
    )
    assert len(calls) == 2 and rec["x"] == 2
    q = rec["quiet"]
    assert [a["load_before"] for a in q["attempts"]] == [3.0, 1.0]
    assert "load 3.00 > 1.5" in q["attempts"][0]["disturbed"]
    assert q["attempts"][1]["disturbed"] is None
    assert (q["load_before"], q["load_after"], q["noisy"]) == (1.0, 1.8, False)


def test_a_round_disturbed_every_time_is_marked_noisy_after_the_retries():
    calls = []
    rec = run_round("r", lambda: calls.append(1) or {}, _protocol([4.0, 4.0] * 3, retries=2))
    assert len(calls) == 3
    assert rec["quiet"]["noisy"] and "load 4.00 > 1.5" in rec["quiet"]["noisy_reason"]


def test_settle_waits_for_the_load_to_drop():
    loads = iter([3.0, 2.0, 1.4, 1.2])
    slept = []
    p = Protocol(load_fn=lambda: next(loads), sleep_fn=slept.append, settle_s=60.0)
    load, _ = p.settle()
    assert load == 1.4 and len(slept) == 2


def test_protocol_arguments_and_bad_values(tmp_path):
    parser = cli.parser("x", tmp_path / "x.json")
    p = cli.start("bench-x", parser.parse_args(["--retries", "1", "--allow-busy"]))
    assert p.retries == 1 and p.allow_busy and p.max_load == 1.5
    assert p.to_dict()["max_other_cores"] == 0.25
    with pytest.raises(SystemExit, match="--retries -1"):
        cli.start("bench-x", parser.parse_args(["--retries", "-1"]))
