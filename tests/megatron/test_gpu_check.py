"""scripts/gpu_check: skips cleanly without CUDA; its parts run at toy sizes on the CPU.

The full check needs a GPU (results/gpu/ holds what it wrote where one was available);
``scripts/gpu_check.py --cpu-smoke`` runs every part at toy sizes on the CPU by hand.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scape.megatron.versions import TESTED_VERSIONS

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SCRIPT = SCRIPTS / "gpu_check.py"
PARTS = ("pack_s", "finish_s", "select_s", "step_s")


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


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


@pytest.mark.parametrize("implementation", ["blocked", "fused"])
def test_kernel_microbench_at_toy_sizes(implementation):
    """One rank's step at W=4 on a toy model, each part and the whole step against the
    copy pass measured beside it (the fused path under Triton's interpreter on a CPU)."""
    pytest.importorskip("triton")
    report = _gpu_check().kernel_microbench(
        total_params=50_000,
        world_size=4,
        bucket_size=10_000,
        sparsities=[0.9],
        device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
        repeats=1,
        implementation=implementation,
    )
    assert (
        report["bucket_elems"] % 128 == 0 and report["buckets"] * report["bucket_elems"] >= 50_000
    )
    assert report["implementation"] == implementation and report["floor_copy_pass_s"] > 0
    row = report["sparsity_0.9"]
    shard = report["shard_elems"]
    assert row["k_per_chunk"] == 10 and row["value_dtype"] == "bfloat16"
    assert row["selected_per_shard"] == shard // 100 * 10 + min(10, shard % 100)
    assert all(row[k] > 0 for k in PARTS)
    assert row["step_vs_copy_pass"] == pytest.approx(row["step_s"] / report["floor_copy_pass_s"])
    assert row["step_vs_traffic_floor"] == pytest.approx(row["step_s"] / report["traffic_floor_s"])
    blocked_reference = row["blocked_one_bucket_times_buckets_s"]
    assert (blocked_reference is None) == (implementation == "blocked")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the check runs for real")
def test_the_shell_entry_point_says_skipped_in_one_line_and_installs_nothing(tmp_path):
    """Without CUDA gpu_check.sh stops before any install: one line, exit 0, nothing written."""
    out = tmp_path / "gpu"
    proc = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().count("\n") == 0 and "SKIPPED" in proc.stdout, proc.stdout
    assert not out.exists()


def test_adapter_check_at_toy_sizes_times_every_method_and_matches_the_simulator(tmp_path):
    """The adapter part of the GPU check, on the CPU (gloo, tiny Llama, fp32): dense AdamS's,
    AdamW's and SCAPE's phases, and SCAPE bit-identical to the simulator."""
    out = tmp_path / "adapter.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_adapter_check.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["shape"] == "tiny-llama" and report["shapes_tried"] == ["tiny-llama"]
    assert report["megatron_core"] in TESTED_VERSIONS
    for method in ("dense", "adamw", "scape"):
        run = report[method]
        assert run["buckets"] > 1 and run["steps_timed"] >= 1
        assert all(run[k] > 0 for k in ("forward_backward_s", "grad_sync_s", "optimizer_step_s"))
    # same weights, same first batch: the same first loss
    assert report["dense"]["first_loss"] == report["scape"]["first_loss"]
    assert report["scape"]["implementation"] == "blocked"
    assert report["scape_sync_and_step_vs_dense_step"] > 0
    assert report["ok"] is True
    sim = report["simulator"]
    assert sim["bit_identical"] and sim["within_tolerance"] and sim["max_abs_diff"] == 0.0
    assert len(sim["per_step"]) == sim["steps"] >= 3
