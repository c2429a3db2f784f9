"""scripts/gpu_check: skips cleanly without CUDA; its kernel micro-benchmark runs (toy sizes).

The full check needs a GPU (results/gpu/ holds what it wrote where one was available);
``scripts/gpu_check.py --cpu-smoke`` runs every part at toy sizes on the CPU by hand.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the check runs for real")
def test_without_cuda_it_says_skipped_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SKIPPED" in proc.stdout
    assert not out.exists()


def test_kernel_microbench_at_toy_sizes():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    report = gpu_check.kernel_microbench(
        total_params=50_000,
        world_size=4,
        bucket_size=10_000,
        sparsities=[0.9],
        device=torch.device("cpu"),
        repeats=1,
    )
    assert (
        report["bucket_elems"] % 128 == 0 and report["buckets"] * report["bucket_elems"] >= 50_000
    )
    row = report["sparsity_0.9"]
    shard = report["shard_elems"]
    assert row["k_per_chunk"] == 10
    assert row["selected_per_shard"] == shard // 100 * 10 + min(10, shard % 100)
    assert all(v >= 0 for k, v in row.items() if k.endswith("_s"))
