"""The GPU-speed goals (issue 40) and the per-rank memory, read from the newest GPU check.

Two sections of ``results/bench/README.md`` (``make bench-report``):

* the goal table: one rank's SCAPE step at Llama-1.8B for W=32 against the copy-pass floor
  the same run measured; the adapter's SCAPE-99 grad sync and step against dense AdamS's
  step at W=1; peak memory; GPT-345M whole steps; each with its goal and met / not met;
* memory per rank: the bytes per entry each method holds (bf16 model params, fp32 grads and
  main params, the optimizer's state; ZeRO-1 shards the last two over W, SCAPE keeps its
  moment, second moment and fp32 params whole), at W=1 against what the GPU check measured,
  and at W=32 for Llama-1.8B.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["GOALS", "bytes_per_entry", "goal_rows", "memory_rows", "newest_check"]

GIB = 2**30
# goal -> (what, bound): figures from a check at or below the bound meet the goal
GOALS = {
    "scape99_rank_step_s": ("one rank's SCAPE-99 step (pack, finish, select), W=32, Llama-1.8B", 0.020),
    "scape90_rank_step_s": ("the same, SCAPE-90", 0.030),
    "adapter_ratio": ("adapter W=1: SCAPE-99 grad sync + step / dense AdamS's", 1.5),
    "peak_ratio": ("adapter W=1: SCAPE-99 peak memory / dense AdamS's", 1.0),
    "gpt_ratio": ("GPT-345M whole step, SCAPE-90 and -99 / dense AdamS", 1.1),
}  # fmt: skip


def newest_check(root: Path = Path("results/gpu")) -> tuple[Path, dict[str, Any]] | None:
    """The newest finished GPU check of the fused step (one with ``floor_copy_pass_s``)."""
    for path in sorted(root.glob("gpu_check_*.json"), reverse=True):
        report = json.loads(path.read_text())
        if report.get("status") == "ok" and "floor_copy_pass_s" in report.get("kernels", {}):
            return path, report
    return None


def bytes_per_entry(method: str, world_size: int) -> float:
    """Bytes a rank holds per parameter entry of a bf16 model with fp32 grads: params 2, grads
    4; ZeRO-1 shards fp32 main params and the state over W (AdamS: m; AdamW: m and v); SCAPE
    holds its own moment, the second moment and the fp32 params whole (every rank updates
    every entry)."""
    sharded = {"adams": 4 + 4, "adamw": 4 + 4 + 4}
    if method in sharded:
        return 2 + 4 + sharded[method] / world_size
    if method == "scape":
        return 2 + 4 + 4 + 4 + 4
    raise ValueError(f"unknown method {method!r}")


def _verdict(value: float | None, bound: float) -> str:
    return "-" if value is None else ("met" if value <= bound else "not met")


def goal_rows(report: dict[str, Any]) -> list[list[str]]:
    k, a = report["kernels"], report.get("adapter", {})
    floor = k["floor_copy_pass_s"]
    rows = []
    for label, s in (("scape99_rank_step_s", 0.99), ("scape90_rank_step_s", 0.9)):
        r = k.get(f"sparsity_{s}", {})
        what, bound = GOALS[label]
        value = r.get("step_s")
        blocked = r.get("blocked_one_bucket_times_buckets_s")
        text = "-" if value is None else (
            f"{value * 1e3:.1f} ms: pack {r['pack_s'] * 1e3:.1f}, finish {r['finish_s'] * 1e3:.1f}, "
            f"select {r['select_s'] * 1e3:.1f}; {value / floor:.1f} copy passes "
            f"({floor * 1e3:.2f} ms each), x{r['step_vs_traffic_floor']:.1f} the traffic floor"
            + (f"; the blocked path: {blocked * 1e3:,.0f} ms" if blocked else ""))  # fmt: skip
        rows.append([what, f"<= {bound * 1e3:.0f} ms", text, _verdict(value, bound)])
    dense, scape = a.get("dense"), a.get("scape")
    ratio = a.get("scape_sync_and_step_vs_dense_step")
    what, bound = GOALS["adapter_ratio"]
    text = "-" if ratio is None else (
        f"x{ratio:.1f}: SCAPE {(scape['grad_sync_s'] + scape['optimizer_step_s']) * 1e3:.0f} ms, "
        f"dense AdamS {(dense['grad_sync_s'] + dense['optimizer_step_s']) * 1e3:.1f} ms "
        f"({a.get('shape')})")  # fmt: skip
    rows.append([what, f"<= x{bound}", text, _verdict(ratio, bound)])
    peak = a.get("scape_peak_vs_dense_peak")
    what, bound = GOALS["peak_ratio"]
    text = "-" if peak is None else (
        f"x{peak:.2f}: SCAPE {scape['peak_memory_bytes'] / GIB:.1f} GiB, dense AdamS "
        f"{dense['peak_memory_bytes'] / GIB:.1f}, AdamW {a['adamw']['peak_memory_bytes'] / GIB:.1f}")  # fmt: skip
    rows.append([what, f"<= x{bound:g}", text, _verdict(peak, bound)])
    gpt = {r["method"]: r for r in report.get("megatron", []) if "median_step_s" in r}
    what, bound = GOALS["gpt_ratio"]
    ratios = [gpt[m]["vs_dense_adams"] for m in ("scape90", "scape99") if m in gpt]
    text = "-" if len(ratios) < 2 else (
        f"x{ratios[0]:.2f} / x{ratios[1]:.2f} (dense AdamS {gpt['adams']['median_step_s'] * 1e3:.0f} "
        f"ms, {gpt['adams']['tokens_per_step']:,} tokens)")  # fmt: skip
    rows.append([what, f"<= x{bound}", text, _verdict(max(ratios) if ratios else None, bound)])
    return rows


def memory_rows(report: dict[str, Any] | None, n_params: int) -> tuple[list[str], list[list[str]]]:
    """(header, rows): bytes per entry by method at W=1 and W=32, the GPU check's W=1 figures
    beside them."""
    measured = {}
    if report is not None and "shape" in report.get("adapter", {}):
        a = report["adapter"]
        for method, key in (("adams", "dense"), ("adamw", "adamw"), ("scape", "scape")):
            run = a.get(key, {})
            if run.get("memory_held_bytes"):
                measured[method] = (run["memory_held_bytes"] / run["params"],
                                    run["peak_memory_bytes"] / GIB)  # fmt: skip
    rows = []
    for method, label in (("adams", "dense AdamS (ZeRO-1)"), ("adamw", "dense AdamW (ZeRO-1)"),
                          ("scape", "SCAPE")):  # fmt: skip
        held, peak = measured.get(method, (None, None))
        rows.append([label, f"{bytes_per_entry(method, 1):.2f}",
                     "-" if held is None else f"{held:.2f} ({peak:.1f} GiB peak)",
                     f"{bytes_per_entry(method, 32):.2f}",
                     f"{bytes_per_entry(method, 32) * n_params / GIB:.1f}"])  # fmt: skip
    header = ["method", "bytes/entry, W=1", "measured at W=1 (held after step 1)",
              "bytes/entry, W=32", "GiB per rank, Llama-1.8B, W=32"]  # fmt: skip
    return header, rows
