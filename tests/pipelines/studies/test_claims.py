"""Run claims: one worker per run, dead workers' locks taken over, other hosts' respected."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from pipelines.studies.claims import claim, held, wait_for_others


def test_a_run_is_held_by_one_worker_at_a_time(tmp_path: Path) -> None:
    with claim(tmp_path, "r1") as first:
        assert first and held(tmp_path, ["r1", "r2"]) == ["r1"]
        with claim(tmp_path, "r1") as second:
            assert not second  # this process is alive: its lock stands
    assert held(tmp_path, ["r1"]) == [] and not list(tmp_path.iterdir())  # released
    with claim(tmp_path, "r1") as again:
        assert again


def test_a_dead_workers_lock_is_taken_over_another_hosts_is_respected(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / "r1.jsonl.lock").write_text(f"{socket.gethostname()} {dead}\n")
    (tmp_path / "r2.jsonl.lock").write_text("another-node-of-the-cluster 1\n")
    (tmp_path / "r3.jsonl.lock").write_text("")  # its writer died before writing
    assert held(tmp_path, ["r1", "r2", "r3"]) == ["r2"]
    with claim(tmp_path, "r1") as mine, claim(tmp_path, "r3") as also:
        assert mine and also
    with claim(tmp_path, "r2") as theirs:
        assert not theirs


def test_waiting_ends_when_the_other_worker_releases(tmp_path: Path) -> None:
    code = (f"import time; from pathlib import Path; from pipelines.studies.claims import claim\n"
            f"with claim(Path({str(tmp_path)!r}), 'r1'):\n"
            f"    Path({str(tmp_path / 'started')!r}).touch(); time.sleep(1.5)")  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", code])
    while not (tmp_path / "started").exists():
        time.sleep(0.05)
    start = time.monotonic()
    wait_for_others(tmp_path, ["r1"], poll_s=0.1)
    assert time.monotonic() - start > 0.5 and not held(tmp_path, ["r1"])
    other.wait(timeout=30)
