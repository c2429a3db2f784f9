"""The efficiency table of the tables stage: bytes from the runs, speed from an emulated cluster.

The runs of ``make reproduce-table`` train on CPU processes that talk over loopback on a
shared machine; their step times say nothing about a bandwidth-limited cluster (a fresh run
once printed SCAPE-99 at "0.56x, -81.7% time saved"). So the table never turns them into
a speed-up. Speed columns come only from a step-time file measured on an emulated cluster:
``make reproduce-table`` run as root writes ``<output_root>/steptime.json`` with
``python -m benchmarks.megatron_step --suite reproduce`` (the pretrain stage's Megatron train
step of every run's model and optimizer, ranks in network namespaces behind ``tc tbf``
links). Without that file, or when it says why it was skipped, the speed columns are left
out and a note says why.

The file's format (what this module reads; the benchmark writes it)::

    {"suite": "reproduce", "world_size": 2, "link": {"label": "1gbit", ...},
     "steps": 8,
     "points": [{"experiment": ..., "optimizer": <label>, "step_s": <median>,
                 "step_s_p25": ..., "step_s_p75": ..., "speedup_vs_reference": ...,
                 "reference": "AdamS", "load_before": ..., "load_after": ...,
                 "noisy": false, "noisy_reason": null}, ...]}
    or {"skipped": "<why>"}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

__all__ = ["STEP_TIMES_FILE", "efficiency_table", "read_step_times"]

STEP_TIMES_FILE = "steptime.json"
BASELINE = "AdamS"
HOW = (
    "`make reproduce-table` run as root measures them on an emulated cluster "
    "(`python -m benchmarks.megatron_step --suite reproduce`)"
)


class _Run(Protocol):  # what the tables stage's RunSummary offers
    experiment: str
    label: str

    def bytes_per_step(self, skip: int) -> dict[str, float]: ...


def read_step_times(path: Path) -> tuple[dict[tuple[str, str], dict[str, Any]], str]:
    """((experiment, optimizer label) -> point, note). No points when the file is missing,
    skipped or unreadable; the note then says why the speed columns are left out."""
    if not path.is_file():
        return {}, (
            f"No speed columns: no emulated-cluster step times ({path} not found). The runs' "
            f"own step times are CPU processes on loopback, not a speed measure; {HOW}."
        )
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return {}, f"No speed columns: {path} is unreadable ({err}); {HOW}."
    if "skipped" in doc:
        return {}, (
            f"No speed columns: the emulated-cluster step-time benchmark was skipped "
            f"({doc['skipped']}). The runs' own step times are CPU processes on loopback, "
            "not a speed measure."
        )
    points = {(p["experiment"], p["optimizer"]): p for p in doc.get("points", [])}
    if not points:
        return {}, f"No speed columns: {path} holds no step times; {HOW}."
    loads = [p[k] for p in points.values() for k in ("load_before", "load_after")
             if p.get(k) is not None]  # fmt: skip
    noisy = sorted({f"{e} {o}" for (e, o), p in points.items() if p.get("noisy")})
    link = (doc.get("link") or {}).get("label", "?")
    note = (
        f"Step times: the pretrain stage's Megatron train step of each run's model and "
        f"optimizer on an emulated cluster ({doc.get('world_size', '?')} ranks in network "
        f"namespaces, `tc tbf` links of {link}), median over {doc.get('steps', '?')} steps, "
        f"methods interleaved step by step; speed-up = median of per-step ratios against "
        f"{BASELINE}; file {path.name}"
    )
    if loads:
        note += f"; 1-min load average {min(loads):.2f}-{max(loads):.2f} before/after"
    note += "."
    if noisy:
        note += f" Measured on a busy machine (noisy): {', '.join(noisy)}."
    return points, note


def efficiency_table(
    runs: list[_Run], skip: int, step_times: Path, claims: dict[tuple[str, str], str]
) -> tuple[list[str], list[list[str]], str]:
    """Header, rows and a one-paragraph note for ``efficiency.{md,csv,tex}``; ``claims``:
    (experiment, optimizer label) -> the paper's claim for the last column."""
    points, note = read_step_times(step_times)
    timed = any((r.experiment, r.label) in points for r in runs)
    header = ["experiment", "optimizer", "MB/step/rank", "grad MB", "param MB", "mask MB"]
    if timed:
        header += ["emulated step (ms)", f"speed-up vs {BASELINE}",
                   f"time saved vs {BASELINE}", "load before/after"]  # fmt: skip
    header.append("paper")
    rows = []
    for r in runs:
        b = r.bytes_per_step(skip)
        row = [r.experiment, r.label, f"{sum(b.values()) / 1e6:.3f}",
               f"{b.get('grad_values', 0.0) / 1e6:.3f}", f"{b.get('param_values', 0.0) / 1e6:.3f}",
               f"{b.get('masks', 0.0) / 1e6:.3f}"]  # fmt: skip
        if timed:
            row += _speed_cells(points.get((r.experiment, r.label)))
        row.append(claims.get((r.experiment, r.label), "-"))
        rows.append(row)
    return header, rows, note


def _speed_cells(p: dict[str, Any] | None) -> list[str]:
    if p is None or p.get("step_s") is None:
        return ["-", "-", "-", "-"]
    spread = ""
    if p.get("step_s_p25") is not None and p.get("step_s_p75") is not None:
        spread = f" [{p['step_s_p25'] * 1e3:.0f}-{p['step_s_p75'] * 1e3:.0f}]"
    sp = p.get("speedup_vs_reference")
    load = "-"
    if p.get("load_before") is not None and p.get("load_after") is not None:
        load = f"{p['load_before']:.2f}/{p['load_after']:.2f}" + (
            " noisy" if p.get("noisy") else ""
        )
    return [
        f"{p['step_s'] * 1e3:.0f}{spread}",
        "-" if sp is None else f"{sp:.2f}x",
        "-" if sp is None else f"{100 * (1 - 1 / sp):.1f}%",
        load,
    ]
