"""The report's Markdown tables, every figure read from a :class:`RunIndex`."""

from __future__ import annotations

import math
import statistics
from typing import Any

from pipelines.studies.quality_config import ReadingRow, VariantSpec
from pipelines.studies.quality_run import STALENESS_KEYS
from pipelines.studies.reading_costs import reading_cost
from pipelines.studies.report_stats import (
    _fmt_gap,
    _fmt_loss,
    _lr_text,
    clip_share,
    gap_cell,
    policy_clips,
    size_models,
)
from pipelines.studies.run_index import REFERENCE, RunIndex, RunKey

__all__ = [
    "clip_table",
    "cost_table",
    "gap_table",
    "lr_table",
    "overview_table",
    "paired_table",
    "size_table",
    "staleness_table",
]


def gap_table(
    index: RunIndex,
    variants: list[str],
    labels: dict[str, str],
    models: list[str],
    horizons: list[int],
    *,
    lr_from: int | None = None,
    reference: str = REFERENCE,
) -> str:
    """Rows: variants; per model and horizon: final loss, paired gap to ``reference`` (dense
    AdamS), lr used."""
    head = ["variant"]
    for model in models:
        for steps in horizons:
            head += [f"{model} {steps}: loss", f"{model} {steps}: gap", f"{model} {steps}: lr x"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for variant in variants:
        cells = [labels.get(variant, variant).replace("|", "\\|")]
        present = False
        for model in models:
            for steps in horizons:
                cell = gap_cell(index, model, variant, steps, lr_from=lr_from,
                                reference=reference)  # fmt: skip
                present = present or cell.loss is not None
                cells += [
                    _fmt_loss(cell.loss),
                    "0 (reference)" if variant == reference and cell.gaps else _fmt_gap(cell.gaps),
                    "-"
                    if cell.lr is None or cell.loss is None
                    else f"{cell.lr:g}" + ("" if cell.closed else " (grid open)"),
                ]
        if present:
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_table(
    index: RunIndex, variants: list[str], labels: dict[str, str], models: list[str], steps: int
) -> str:
    """Mean final loss over the cell's seeds at every lr scale run on all of them, per model,
    at one horizon; the chosen lr, and whether the grid is closed around it."""
    scales = sorted({k.lr_scale for k in index.runs if k.steps == steps})
    head = ["variant", "model", "seeds", *[f"lr x{s:g}" for s in scales], "chosen"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for variant in variants:
        for model in models:
            choice = index.lr_choice(model, variant, steps)
            if choice is None or len(choice.grid) < 2:
                continue
            vals = [
                statistics.fmean(
                    [index.final(RunKey(model, variant, steps, lr, s)) for s in choice.seeds]
                )
                if lr in choice.grid
                else None
                for lr in scales
            ]
            chosen = f"x{choice.lr:g}" + ("" if choice.closed else " (grid open)")
            label = labels.get(variant, variant).replace("|", "\\|")
            row = [label, model, str(len(choice.seeds)), *map(_fmt_loss, vals), chosen]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def cost_table(variants: dict[str, VariantSpec], labels: dict[str, str], n: int, w: int) -> str:
    """Bytes per rank per step and optimizer memory per rank at one model shape."""
    dense = (
        reading_cost(variants[REFERENCE], n, w).bytes_per_step if REFERENCE in variants else None
    )
    lines = [
        "| variant | MB per rank per step | of which masks | dense / this | optimizer memory per rank (GB) | what it holds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, variant in variants.items():
        cost = reading_cost(variant, n, w)
        ratio = f"{dense / cost.bytes_per_step:.1f}" if dense else "-"
        lines.append(
            f"| {labels.get(name, name).replace('|', chr(92) + '|')} | {cost.bytes_per_step / 1e6:,.1f} "
            f"| {cost.mask_bytes / 1e6:,.1f} | {ratio} | {cost.memory / 1e9:.2f} | {cost.memory_note} |"
        )
    return "\n".join(lines)


def _overview_gap(index: RunIndex, model: str, variant: str, steps: int) -> str:
    """Mean paired gap over the seeds run, lr chosen at 1,500 steps where that horizon has a
    grid and runs at the chosen lr exist, else at this horizon."""
    cell = gap_cell(index, model, variant, steps, lr_from=1500)
    if not cell.gaps:
        cell = gap_cell(index, model, variant, steps)
    if not cell.gaps:
        return "-"
    if any(not math.isfinite(g) for g in cell.gaps):
        return "div."
    return f"{statistics.fmean(cell.gaps):+.1f}" + (
        f" ({len(cell.gaps)})" if len(cell.gaps) > 1 else ""
    )


def overview_table(
    index: RunIndex,
    rows: list[ReadingRow],
    variants: dict[str, VariantSpec],
    models: list[str],
    horizons: list[int],
    cost_shape: tuple[str, int, int],
) -> str:
    """The opening table: per reading, its gaps (%) to AdamS at each horizon for 90% / 99% and
    each model, its bytes and memory at ``cost_shape``, and the abstract's sentences it keeps."""
    _, n, w = cost_shape
    head = ["reading", "what travels, what every rank does", "abstract"]
    for model in models:
        head += [f"{model} gap % at {'/'.join(map(str, horizons))}: 90%", "99%"]
    head += ["MB per rank per step 90% / 99%", "optimizer GB per rank"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [row.name, row.what, row.abstract]
        for model in models:
            for variant in row.variants:
                cells.append(" / ".join(_overview_gap(index, model, variant, h) for h in horizons))
        costs = [reading_cost(variants[v], n, w) for v in row.variants if v in variants]
        cells.append(" / ".join(f"{c.bytes_per_step / 1e6:,.0f}" for c in costs) or "-")
        cells.append(f"{costs[0].memory / 1e9:.2f}" if costs else "-")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def staleness_table(index: RunIndex, labels: dict[str, str]) -> str:
    """How stale the replicas of a stale-replica reading (R3) got, per run that recorded it:
    the oldest any replica entry was (steps since its owner last sent it), and the largest
    distance of a replica from the owners' values at the end, relative to their norm."""
    rows = [
        "| variant | model | steps | lr x | seed | oldest replica entry (steps) | replica gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(index.runs, key=lambda k: (k.variant, k.model, k.steps, k.lr_scale, k.seed)):
        final = index.runs[key].final
        if all(k in final for k in STALENESS_KEYS):
            rows.append(
                f"| {labels.get(key.variant, key.variant)} | {key.model} | {key.steps:,} | "
                f"x{key.lr_scale:g} | {key.seed} | {final['max_staleness']} | "
                f"{final['replica_gap']:.2%} |"
            )
    return "\n".join(rows) if len(rows) > 2 else ""


def paired_table(rows: list[dict[str, Any]], labels: dict[str, str], sides: tuple[str, str]) -> str:
    """``paired_rows`` as a table; ``sides`` names the base and the changed arm. Bytes per
    step are shown only where the two arms send different amounts."""
    base, changed = sides
    sent = any(len(set(r["bytes"].values())) > 1 for r in rows)
    head = ["model", "method", "lr x", "seeds", f"{base}: loss", f"{changed}: loss",
            f"{changed} - {base} (nats, paired)", f"{base}: sd over seeds",
            "within the seeds' spread"]  # fmt: skip
    head += [f"bytes per rank per step, {base} -> {changed}"] if sent else []
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        b = r["bytes"]
        nbytes = "-" if None in b.values() else " -> ".join(f"{v:,.0f}" for v in b.values())
        lines.append("| " + " | ".join([
            r["model"], labels.get(r["variant"], r["variant"]), f"{r['lr']:g}",
            str(len(r["seeds"])), f"{r['base']:.3f}", f"{r['changed_loss']:.3f}",
            f"{r['diff']:+.4f} ± {r['diff_sd']:.4f}", f"{r['base_sd']:.4f}",
            "yes" if r["within"] else "no", *([nbytes] if sent else []),
        ]) + " |")  # fmt: skip
    return "\n".join(lines)


def size_table(
    index: RunIndex, variants: list[str], labels: dict[str, str], horizons: list[int]
) -> str:
    """Gap to dense AdamS against model size: per size and horizon, each variant's paired
    gap (each at its lr chosen over the seeds) and the lrs chosen; only cells that were run."""
    head = ["model", "parameters", "steps", "AdamS lr x",
            *[f"{labels.get(v, v)}: gap (lr x)" for v in variants]]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for model in size_models(index):
        for steps in horizons:
            ref = gap_cell(index, model, REFERENCE, steps)
            cells = [gap_cell(index, model, v, steps) for v in variants]
            if ref.loss is None or not any(c.gaps for c in cells):
                continue
            row = [model, index.params_text(model), f"{steps:,}", _lr_text(ref),
                   *[f"{_fmt_gap(c.gaps)} ({_lr_text(c)})" if c.gaps else "-" for c in cells]]  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def clip_table(
    index: RunIndex, variants: list[str], labels: dict[str, str], models: list[str],
    horizons: list[int],
) -> str:  # fmt: skip
    """How often the clip acted, per variant at its chosen lr, per model and horizon: the
    mean over seeds of the share of logged steps clipped, and the median pre-clip norm."""
    clip = next(iter(policy_clips(index, variants)), None)
    if not clip:
        return ""
    head = ["variant", *[f"{m} {h}" for m in models for h in horizons]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for variant in variants:
        cells = []
        for model in models:
            for steps in horizons:
                lr = index.best_lr(model, variant, steps)
                shares = [] if lr is None else [
                    clip_share(index.runs[RunKey(model, variant, steps, lr, s)], clip)
                    for s in index.seeds(model, variant, steps, lr)]  # fmt: skip
                shares = [x for x in shares if x is not None]
                cells.append("-" if not shares else
                             f"{100 * statistics.fmean(x[0] for x in shares):.0f}% "
                             f"({statistics.median(x[1] for x in shares):.2f})")  # fmt: skip
        if any(c != "-" for c in cells):
            lines.append("| " + " | ".join([labels.get(variant, variant), *cells]) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""
