"""The quality study's report: summary table (markdown and CSV) and loss-curve plots.

Reads every finished run under ``<out_dir>/runs`` (unfinished ``.partial`` files are
ignored), so a report can be written at any time from whatever has finished.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunLog", "SummaryRow", "load_runs", "summarize", "write_report"]

DENSE_REFERENCE = "adams"  # the gap column is relative to dense AdamS, as the targets are


@dataclass
class RunLog:
    header: dict[str, Any]
    steps: list[dict[str, Any]]
    final: dict[str, Any]

    @property
    def model(self) -> str:
        return self.header["model"]

    @property
    def variant(self) -> str:
        return self.header["variant"]


def load_runs(runs_dir: Path) -> list[RunLog]:
    runs = []
    for path in sorted(runs_dir.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        if len(lines) < 2 or lines[-1].get("event") != "final":
            continue
        runs.append(RunLog(lines[0], lines[1:-1], lines[-1]))
    return runs


@dataclass
class SummaryRow:
    model: str
    variant: str
    seeds: int
    val_mean: float
    val_std: float  # sample std over seeds (0 with one seed)
    gap_pct: float | None  # (mean - AdamS mean) / AdamS mean, percent
    paired_gap_pct: float | None  # mean over seeds of (run - AdamS run, same seed) / AdamS run
    paired_gap_std: float | None  # its std over seeds (same data and init: less noisy)
    diverged: int
    mask_overlap: float | None  # mean over sparse steps and seeds
    residual_norm: float | None  # at the last step, mean over seeds
    max_age: int | None  # oldest unsent entry's age, max over steps and seeds
    bytes_ratio: float | None  # bytes per rank per step relative to dense AdamS


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def summarize(runs: list[RunLog], variant_order: list[str]) -> list[SummaryRow]:
    groups: dict[tuple[str, str], list[RunLog]] = defaultdict(list)
    for run in runs:
        groups[(run.model, run.variant)].append(run)
    order = {name: i for i, name in enumerate(variant_order)}
    rows = []
    for (model, variant), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], len(order)), kv[0][1])
    ):
        finals = [r.final["final_val_loss"] for r in group]
        overlaps = [s.get("mask_overlap") for r in group for s in r.steps]
        ages = [s["max_age"] for r in group for s in r.steps if s.get("max_age") is not None]
        residuals = [r.steps[-1].get("residual_norm") for r in group if r.steps]
        rows.append(
            SummaryRow(
                model=model,
                variant=variant,
                seeds=len(group),
                val_mean=statistics.fmean(finals),
                val_std=statistics.stdev(finals) if len(finals) > 1 else 0.0,
                gap_pct=None,
                paired_gap_pct=None,
                paired_gap_std=None,
                diverged=sum(bool(r.final["diverged"]) for r in group),
                mask_overlap=_mean(overlaps),
                residual_norm=_mean(residuals),
                max_age=max(ages) if ages else None,
                bytes_ratio=_mean([_mean([s["bytes"] for s in r.steps]) for r in group]),
            )
        )
    reference = {
        (r.model, r.header.get("seed")): r.final["final_val_loss"]
        for r in runs
        if r.variant == DENSE_REFERENCE
    }
    for row in rows:
        paired = [
            100.0 * (r.final["final_val_loss"] - reference[key]) / reference[key]
            for r in groups[(row.model, row.variant)]
            if (key := (r.model, r.header.get("seed"))) in reference
        ]
        if paired:
            row.paired_gap_pct = statistics.fmean(paired)
            row.paired_gap_std = statistics.stdev(paired) if len(paired) > 1 else 0.0
    for model in {r.model for r in rows}:
        ref = next((r for r in rows if r.model == model and r.variant == DENSE_REFERENCE), None)
        ref_val = ref.val_mean if ref else None
        ref_bytes = ref.bytes_ratio if ref else None  # still absolute bytes here
        for row in rows:
            if row.model != model:
                continue
            row.gap_pct = 100.0 * (row.val_mean - ref_val) / ref_val if ref_val else None
            ok = ref_bytes and row.bytes_ratio is not None
            row.bytes_ratio = row.bytes_ratio / ref_bytes if ok else None
    return rows


COLUMNS = [
    ("model", "model"),
    ("variant", "variant"),
    ("seeds", "seeds"),
    ("val_mean", "final val loss (mean)"),
    ("val_std", "std over seeds"),
    ("gap_pct", "gap to AdamS (%)"),
    ("paired_gap_pct", "paired gap (%)"),
    ("paired_gap_std", "paired gap std"),
    ("diverged", "diverged"),
    ("mask_overlap", "mask overlap"),
    ("residual_norm", "final residual norm"),
    ("max_age", "max age (steps)"),
    ("bytes_ratio", "bytes vs dense"),
]


def _fmt(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if key in ("gap_pct", "paired_gap_pct"):
            return f"{value:+.2f}"
        if key == "paired_gap_std":
            return f"{value:.2f}"
        if key in ("val_mean", "val_std", "mask_overlap", "bytes_ratio"):
            return f"{value:.4f}"
        return f"{value:.3g}"
    return str(value)


def markdown_table(rows: list[SummaryRow], labels: dict[str, str]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join(" --- " for _ in COLUMNS) + "|"
    body = []
    for row in rows:
        cells = []
        for key, _ in COLUMNS:
            value = getattr(row, key)
            text = labels.get(value, value) if key == "variant" else _fmt(value, key)
            cells.append(text.replace("|", "\\|"))  # a literal pipe would split the cell
        body.append("| " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *body])


def write_csv(rows: list[SummaryRow], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow([key for key, _ in COLUMNS])
        for row in rows:
            writer.writerow(
                ["" if getattr(row, k) is None else getattr(row, k) for k, _ in COLUMNS]
            )


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_model(
    runs: list[RunLog],
    model: str,
    groups: list[tuple[str, list[str]]],
    labels: dict[str, str],
    colors: dict[str, Any],
    path: Path,
) -> None:
    """One PNG per model: a row per (title, variants) group, train (smoothed) and validation
    loss, mean over seeds with a min-max band; a variant keeps its colour in every row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 2, figsize=(13, 4.2 * len(groups)), squeeze=False)
    for row_axes, (group_title, names) in zip(axes, groups, strict=True):
        for name in names:
            seeds = [r for r in runs if r.model == model and r.variant == name]
            if not seeds:
                continue
            for ax, key in zip(row_axes, ("loss", "val_loss"), strict=True):
                curves = []
                for r in seeds:
                    pts = [(s["tokens"], s[key]) for s in r.steps if s.get(key) is not None]
                    if key == "loss":
                        ys = _smooth([y for _, y in pts], max(1, len(pts) // 30))
                        pts = list(zip([x for x, _ in pts], ys, strict=True))
                    curves.append(pts)
                n = min(len(c) for c in curves)
                xs = [p[0] / 1e6 for p in curves[0][:n]]
                ys = [[c[i][1] for c in curves] for i in range(n)]
                mean = [statistics.fmean(y) for y in ys]
                (line,) = ax.plot(
                    xs,
                    mean,
                    color=colors.get(name),
                    label=f"{labels.get(name, name)} (n={len(seeds)})",
                )
                if len(seeds) > 1:
                    lo, hi = [min(y) for y in ys], [max(y) for y in ys]
                    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
        for ax, title in zip(row_axes, ("train loss (smoothed)", "validation loss"), strict=True):
            ax.set_title(f"{model}, {group_title}: {title}")
            ax.set_xlabel("tokens (M)")
            ax.set_ylabel("loss (nats)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            # The interesting part is the end of training; the first steps would flatten it.
            finals = [ln.get_ydata()[-1] for ln in ax.get_lines() if len(ln.get_ydata())]
            if finals:
                ax.set_ylim(min(finals) - 0.3, max(finals) + 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    out_dir: Path,
    variant_order: list[str],
    plot_groups: list[tuple[str, list[str]]],
    labels: dict[str, str],
    notes: str,
) -> list[SummaryRow]:
    """summary.md, summary.csv and loss_<model>.png from the finished runs in out_dir/runs.

    ``plot_groups``: (title, variants) of each row of the plots (a variant may appear in
    several rows).
    """
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    # tab20 pairs a dark and a light shade of each hue: the first ten variants get the ten
    # dark shades, so that no two core methods look alike.
    colors = {name: cmap((2 * i) % 20 + (i // 10) % 2) for i, name in enumerate(variant_order)}
    runs = load_runs(out_dir / "runs")
    rows = summarize(runs, variant_order)
    write_csv(rows, out_dir / "summary.csv")
    text = ["# Quality study: summary", "", notes, "", markdown_table(rows, labels), ""]
    (out_dir / "summary.md").write_text("\n".join(text), encoding="utf-8")
    present = {r.variant for r in runs}
    groups = [(t, [v for v in g if v in present]) for t, g in plot_groups]
    groups = [(t, g) for t, g in groups if g]
    for model in sorted({r.model for r in runs}):
        plot_model(runs, model, groups, labels, colors, out_dir / f"loss_{model}.png")
    return rows
