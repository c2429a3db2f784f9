"""scripts/gpu_quality: skips cleanly without CUDA, and its whole path runs at toy size on the
CPU (``--cpu-smoke``): the GPU queue's next runs through the quality study's simulator, each
record written as it finishes, and a second window resumes where the first stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_quality.py"


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the check runs for real")
def test_without_cuda_it_says_skipped_and_writes_nothing(tmp_path: Path) -> None:
    proc = _run("--records", str(tmp_path / "records"), "--summary-dir", str(tmp_path / "gpu"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SKIPPED" in proc.stdout
    assert not (tmp_path / "gpu").exists() and not (tmp_path / "records").exists()


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_cpu_smoke_runs_the_queue_in_windows_and_resumes(
    tmp_path: Path, prepared_small: Path
) -> None:
    records = tmp_path / "records"
    common = ["--cpu-smoke", "--records", str(records), "--summary-dir", str(tmp_path / "gpu"),
              "--work-dir", str(tmp_path / "work"), "--data-dir", str(prepared_small)]  # fmt: skip
    first = _run(*common, "--max-runs", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    names = sorted(p.name for p in records.rglob("*.jsonl"))
    # the verdict's first pair first: dense AdamS and SCAPE-99 at their grid centres, seed 0
    assert names == [
        "smoke_llama__adams__s0__t4.jsonl",
        "smoke_llama__scape99_ramp__s0__t4__lr2.jsonl",
    ]
    second = _run(*common, "--max-runs", "1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "2 of 48 runs done" in second.stdout
    assert len(list(records.rglob("*.jsonl"))) == 3
    (summary, *_) = sorted((tmp_path / "gpu").glob("gpu_queue_cpu-smoke_*.json"))
    report = json.loads(summary.read_text())
    assert report["queue"]["done_after"] in (2, 3) and report["finished"]
    for path in records.rglob("*.jsonl"):
        final = json.loads(path.read_text().splitlines()[-1])
        assert final["event"] == "final" and final["steps"] == 4 and not final["diverged"]


def test_a_missing_corpus_is_named_with_the_fix(tmp_path: Path) -> None:
    proc = _run("--cpu-smoke", "--records", str(tmp_path / "r"), "--data-dir",
                str(tmp_path / "nowhere"), "--max-runs", "1")  # fmt: skip
    assert proc.returncode != 0
    assert "no prepared corpus at" in proc.stderr and "make gpu-corpus" in proc.stderr
