"""The peers study's report: seed statistics per method, steps and time to dense AdamS's loss,
and the table, CSV, JSON and figure (``loss_vs_bytes.png``) written from finished pretrain runs.

Step times come from the emulated-cluster JSON files of ``make bench-peers-cluster``
(:mod:`benchmarks.peers_cluster`); without them the time columns say "not measured".
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.training.runs import run_dir_of
from pipelines.training.tracking import METRICS_FILE, read_metrics

__all__ = ["REFERENCE", "MethodResult", "report", "summarize_method"]

REFERENCE = "adams"


@dataclass
class MethodResult:
    method: str
    label: str
    seeds: int
    final_val_loss: float
    final_val_loss_std: float
    bytes_per_step: float  # per rank, mean over the run (warm-up phases included)
    curve: list[tuple[float, float]]  # (cumulative bytes per rank, seed-mean val loss)
    eval_steps: list[int]
    diverged: int = 0  # seeds whose final validation loss is not finite (left out of the means)
    step_time_s: dict[str, float] = field(default_factory=dict)  # link -> median step time
    time_to_target_s: dict[str, float] = field(default_factory=dict)  # link -> seconds
    steps_to_target: int | None = None


def summarize_method(method: str, label: str, runs: list[list[dict[str, Any]]]) -> MethodResult:
    """Seed statistics of one method from its runs' metrics records."""
    finals, per_step, curves, diverged = [], [], [], 0
    for records in runs:
        totals = [sum(r["bytes"].values()) for r in records]
        per_step.append(sum(totals) / len(totals))
        final = next(r["val_loss"] for r in reversed(records) if "val_loss" in r)
        if not math.isfinite(final):
            diverged += 1
            continue
        finals.append(final)
        cumulative, curve = 0.0, {}
        for r, sent in zip(records, totals, strict=True):
            cumulative += sent
            if "val_loss" in r:
                curve[int(r["step"])] = (cumulative, float(r["val_loss"]))
        curves.append(curve)
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    mean_curve = [
        (statistics.fmean(c[s][0] for c in curves), statistics.fmean(c[s][1] for c in curves))
        for s in steps
    ]
    return MethodResult(
        method=method,
        label=label,
        seeds=len(runs),
        final_val_loss=statistics.fmean(finals) if finals else math.nan,
        final_val_loss_std=statistics.stdev(finals) if len(finals) > 1 else 0.0,
        bytes_per_step=statistics.fmean(per_step),
        curve=mean_curve,
        eval_steps=steps,
        diverged=diverged,
    )


def _link(cluster: dict[str, Any]) -> str:
    return cluster.get("link", {}).get("label") or "emulated cluster"


def _attach_times(results: list[MethodResult], clusters: list[dict[str, Any]]) -> None:
    """Steps to reach dense AdamS's final loss (seed means), and that time on each cluster."""
    target = next(r for r in results if r.method == REFERENCE).final_val_loss
    for r in results:
        reached = [s for s, (_, loss) in zip(r.eval_steps, r.curve, strict=True) if loss <= target]
        r.steps_to_target = reached[0] if reached else None
        for cluster in clusters:
            step_time = cluster.get("methods", {}).get(r.method, {}).get("step_time_s")
            if step_time is None:
                continue
            r.step_time_s[_link(cluster)] = step_time
            if r.steps_to_target is not None:
                r.time_to_target_s[_link(cluster)] = r.steps_to_target * step_time


def _table(results: list[MethodResult], links: list[str]) -> str:
    ref = next(r for r in results if r.method == REFERENCE)
    links = links or ["emulated cluster"]
    head = (
        "| method | final val loss (mean ± sd, n) | vs AdamS | kB/rank/step | AdamS bytes / this |"
        + "".join(f" step time, {link} (ms) |" for link in links)
        + " steps to AdamS's loss |"
        + "".join(f" time to AdamS's loss, {link} (s) |" for link in links)
    )
    lines = [head, "|" + "---|" * (6 + 2 * len(links))]
    for r in results:
        gap = 100.0 * (r.final_val_loss / ref.final_val_loss - 1.0)
        gap_text = f"{gap:+.2f}%" if math.isfinite(gap) else "-"
        step_ms = [
            f"{1000 * r.step_time_s[k]:.0f}" if k in r.step_time_s else "not measured"
            for k in links
        ]
        steps = str(r.steps_to_target) if r.steps_to_target is not None else "never"
        tt = [
            f"{r.time_to_target_s[k]:.1f}"
            if k in r.time_to_target_s
            else ("never" if r.steps_to_target is None else "not measured")
            for k in links
        ]
        loss = f"{r.final_val_loss:.3f} ± {r.final_val_loss_std:.3f} ({r.seeds - r.diverged})"
        if r.diverged:
            loss = f"diverged in {r.diverged} of {r.seeds} seeds" + (
                f"; others {loss}" if r.diverged < r.seeds else ""
            )
        lines.append(
            f"| {r.label} | {loss} "
            f"| {gap_text} | {r.bytes_per_step / 1e3:,.1f} "
            f"| {ref.bytes_per_step / r.bytes_per_step:.1f} | {' | '.join(step_ms)} | {steps} "
            f"| {' | '.join(tt)} |"
        )
    return "\n".join(lines)


def _plot(results: list[MethodResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        xs = [b / 1e6 for b, _ in r.curve]
        ax.plot(xs, [loss for _, loss in r.curve], marker="o", markersize=3, label=r.label)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative MB sent per rank (log)")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.set_title("Validation loss against bytes sent")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    runs: list[tuple[str, int, Any]], out_dir: Path, cluster_jsons: list[Path], command: str
) -> list[MethodResult]:
    """Write the table, CSV, JSON and figure for finished runs; returns the rows."""
    by_method: dict[str, list[list[dict[str, Any]]]] = {}
    labels: dict[str, str] = {}
    for method, _seed, cfg in runs:
        by_method.setdefault(method, []).append(read_metrics(run_dir_of(cfg) / METRICS_FILE))
        labels[method] = cfg.optimizer.label
    results = [summarize_method(m, labels[m], rs) for m, rs in by_method.items()]
    clusters = [json.loads(p.read_text()) for p in cluster_jsons if p.is_file()]
    _attach_times(results, clusters)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = _table(results, [_link(c) for c in clusters])
    (out_dir / "peers.md").write_text(table + "\n")
    (out_dir / "peers.json").write_text(
        json.dumps({"command": command, "results": [vars(r) for r in results]}, indent=1)
    )
    with open(out_dir / "peers.csv", "w") as f:
        f.write("method,label,seeds,diverged,final_val_loss,sd,bytes_per_step,steps_to_target,step_time_s,time_to_target_s\n")  # fmt: skip
        for r in results:
            f.write(
                f"{r.method},{r.label},{r.seeds},{r.diverged},{r.final_val_loss:.5f},"
                f"{r.final_val_loss_std:.5f},{r.bytes_per_step:.0f},{r.steps_to_target or ''},"
                f'"{json.dumps(r.step_time_s)}","{json.dumps(r.time_to_target_s)}"\n'
            )
    _plot(results, out_dir / "loss_vs_bytes.png")
    return results
