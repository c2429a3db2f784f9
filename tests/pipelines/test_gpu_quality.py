"""scripts/gpu_quality: skips cleanly without CUDA, and its whole path runs at toy size on the
CPU (``--cpu-smoke``): the quality study's simulator, three variants, the JSON it writes."""

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
    proc = _run("--out-dir", str(tmp_path / "gpu"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SKIPPED" in proc.stdout
    assert not (tmp_path / "gpu").exists()


def test_cpu_smoke_runs_the_three_variants_and_writes_the_report(
    tmp_path: Path, prepared_small: Path
) -> None:
    proc = _run("--cpu-smoke", "--out-dir", str(tmp_path / "gpu"), "--work-dir",
                str(tmp_path / "work"), "--data-dir", str(prepared_small))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = (tmp_path / "gpu").glob("gpu_quality_cpu-smoke_*.json")
    report = json.loads(path.read_text())
    assert set(report["runs"]) == {"adams", "scape90", "scape99"}
    assert report["runs"]["adams"]["gap_to_adams_pct"] == 0.0
    for run in report["runs"].values():
        assert run["curve"] and run["curve"][-1][0] == 4 and not run["diverged"]
