"""The GPU goal table and the memory per rank read a GPU check as it is written."""

import json

import pytest

from benchmarks.gpu_goals import bytes_per_entry, goal_rows, memory_rows, newest_check


def _report(step_99=0.015, step_90=0.045, peak=(30, 40, 36)):
    kernels = {"floor_copy_pass_s": 0.003}
    for s, step in ((0.99, step_99), (0.9, step_90)):
        kernels[f"sparsity_{s}"] = {"pack_s": 0.001, "finish_s": 0.01, "select_s": 0.001,
                                    "step_s": step, "step_vs_traffic_floor": step / 0.016,
                                    "blocked_one_bucket_times_buckets_s": 2.0}  # fmt: skip
    gib = 2**30

    def run(p, held):
        return {"grad_sync_s": 0.001, "optimizer_step_s": 0.03, "peak_memory_bytes": p * gib,
                "memory_held_bytes": held * 100, "params": 100}  # fmt: skip

    adapter = {"shape": "llama-1.8b", "dense": run(peak[0], 14.0), "scape": run(peak[1], 18.0),
               "adamw": run(peak[2], 18.0), "scape_sync_and_step_vs_dense_step": 1.2,
               "scape_peak_vs_dense_peak": peak[1] / peak[0]}  # fmt: skip
    megatron = [{"method": m, "median_step_s": t, "vs_dense_adams": t / 0.1,
                 "tokens_per_step": 8192} for m, t in (("adams", 0.1), ("scape90", 0.105),
                                                       ("scape99", 0.12))]  # fmt: skip
    return {"status": "ok", "environment": {"gpu": "X"}, "kernels": kernels,
            "adapter": adapter, "megatron": megatron}  # fmt: skip


def test_each_goal_is_judged_against_its_bound():
    status = [row[-1] for row in goal_rows(_report())]
    # SCAPE-99 15 ms <= 20: met; SCAPE-90 45 ms > 30: not; x1.2 <= 1.5: met;
    # peak 40/30 > 1: not; GPT-345M x1.05 and x1.2 > 1.1: not
    assert status == ["met", "not met", "met", "not met", "not met"]


def test_bytes_per_entry_follow_what_each_method_holds():
    assert bytes_per_entry("adams", 1) == 14.0 and bytes_per_entry("adamw", 1) == 18.0
    assert bytes_per_entry("scape", 32) == bytes_per_entry("scape", 1) == 18.0
    assert bytes_per_entry("adams", 32) == pytest.approx(6.25)
    header, rows = memory_rows(_report(), 1_000)
    assert len(rows) == 3 and len(header) == len(rows[0])
    assert rows[0][2].startswith("14.00") and rows[2][2].startswith("18.00")
    with pytest.raises(ValueError, match="unknown method"):
        bytes_per_entry("sgd", 1)


def test_newest_check_skips_older_formats(tmp_path):
    old = {"status": "ok", "environment": {"gpu": "X"}, "kernels": {"sparsity_0.99": {}}}
    (tmp_path / "gpu_check_X_20260101T000000Z.json").write_text(json.dumps(_report()))
    (tmp_path / "gpu_check_X_20260201T000000Z.json").write_text(json.dumps(old))
    path, report = newest_check(tmp_path)
    assert (
        path.name == "gpu_check_X_20260101T000000Z.json"
        and "floor_copy_pass_s" in report["kernels"]
    )
