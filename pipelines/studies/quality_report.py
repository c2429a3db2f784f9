"""The quality study's report: writes ``results/quality/`` (summary.md, runs.csv, recipe.json,
the figures, the README's generated blocks) from the finished runs, at any time.

Its rooms, bottom up: :mod:`~pipelines.studies.run_index` (the runs, one code version,
the lr per cell), :mod:`~pipelines.studies.report_stats` (paired gaps, the size fit, the
clip), :mod:`~pipelines.studies.report_tables`, :mod:`~pipelines.studies.report_figures`,
:mod:`~pipelines.studies.report_prose` (the verdict and the other sentences) and
:mod:`~pipelines.studies.recipe` (what the configs carry). Gaps are paired: a run against
the dense AdamS run with the same model, horizon and seed (same data order and initial
weights), each at its own best lr of the grid.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
from pathlib import Path

from pipelines.studies.quality_config import ReadingRow, VariantSpec
from pipelines.studies.quality_run import STALENESS_KEYS
from pipelines.studies.recipe import recipe, recipe_text, ship, wire_choice
from pipelines.studies.report_figures import plot_curves, plot_gap_vs_steps, plot_shipped
from pipelines.studies.report_prose import (
    divergence_summary,
    early_gap_text,
    finalists_text,
    length_text,
    scale_text,
    train_tokens,
    update_block,
    verdict_text,
)
from pipelines.studies.report_shipped import (
    shipped_cells,
    shipped_multipliers,
    shipped_table,
    shipped_verdict_text,
)
from pipelines.studies.report_stats import VERDICT_MODELS, size_models
from pipelines.studies.report_tables import (
    cost_table,
    gap_table,
    lr_table,
    overview_table,
    staleness_table,
)
from pipelines.studies.run_index import REFERENCE, RunIndex, RunLog, run_key

__all__ = ["RUN_COLUMNS", "write_report", "write_runs_csv"]


def write_report(
    out_dir: Path,
    variants: dict[str, VariantSpec],
    labels: dict[str, str],
    notes: str,
    *,
    finalists: list[str],
    cost_shape: tuple[str, int, int],
    overview: list[ReadingRow] | None = None,
    paper_sizes: dict[str, int] | None = None,
    data_dir: str | Path | None = None,
    gpu_repo: Path | None = None,
) -> RunIndex:
    """summary.md and gap_vs_steps.png from every finished run under ``out_dir/runs``; the
    verdict (:func:`verdict_text`) into the marked block of ``out_dir/README.md`` (the project
    README's is the early-gap study's, :mod:`pipelines.studies.early_gap`); with
    ``gpu_repo``, the GPU queue's cells (:mod:`pipelines.studies.report_gpu`) into its gpu block; the
    size trend (:func:`scale_text`, toward ``paper_sizes``) into the README's scale block."""
    index = RunIndex.load(out_dir)
    keys = list(index.runs)
    models = sorted({k.model for k in keys}, key=lambda m: (not m.startswith("llama"), len(m), m))
    horizons = sorted({k.steps for k in keys})
    order = list(variants) + sorted({k.variant for k in keys} - set(variants))
    screen_h = [h for h in horizons if h in (300, 1500)] or horizons
    text = ["# Reconstruction search: summary", "", index.provenance(), "", notes, ""]
    if overview:
        text += [
            "## The readings (gap to dense AdamS in %, mean over seeds, (n) when n > 1)",
            "",
            overview_table(index, overview, variants, models, horizons, cost_shape),
            "",
        ]
    text += [
        "## Screening (each method at the lr of its lowest mean final loss over its seeds at "
        "that horizon)",
        "",
        gap_table(index, order, labels, models, screen_h),
        "",
    ]
    for steps in horizons:
        table = lr_table(index, order, labels, models, steps)
        if table.count("\n") > 1:
            text += [
                f"## Learning-rate grid at {steps} steps (final val loss, mean over seeds)",
                "",
                table,
                "",
            ]
    final = [v for v in finalists if any(k.variant == v and k.seed > 0 for k in keys)]
    if final:
        text += [
            "## Finalists (every seed; each lr chosen over every seed at the horizon shown)",
            "",
            gap_table(index, [REFERENCE, *final], labels, models, horizons),
            "",
        ]
        plot_gap_vs_steps(index, final, labels, [m for m in models if m in VERDICT_MODELS],
                          horizons, out_dir / "gap_vs_steps.png", sizes=size_models(index))  # fmt: skip
    text += ["## Divergence", "", divergence_summary(index), ""]
    scale = scale_text(index, labels, horizons, paper_sizes or {})
    text += ["## Gap against model size", "", scale, ""]
    stale = staleness_table(index, labels)
    if stale:
        text += ["## Stale replicas (R3)", "", stale, ""]
    name, n, w = cost_shape
    text += [
        f"## Cost at {name} ({n / 1e9:.2f}B parameters), {w} ranks",
        "",
        cost_table({v: variants[v] for v in order if v in variants}, labels, n, w),
        "",
    ]
    verdict_models = [m for m in models if m in VERDICT_MODELS]
    # The verdict is what ships (issue 52): SCAPE at its configs' lr multipliers; the
    # per-cell tuned sentence follows it in results/quality/README.md, named as such.
    multipliers = shipped_multipliers()
    verdict = shipped_verdict_text(index, verdict_models, multipliers)
    shipped = shipped_table(index, verdict_models, multipliers)
    text += ["## As shipped (SCAPE at its configs' lr multipliers)", "", shipped, ""]
    (out_dir / "summary.md").write_text("\n".join(text), encoding="utf-8")
    plot_shipped(index, {h: shipped_cells(index, verdict_models, multipliers, h) for h in horizons},
                 labels, verdict_models, out_dir / "shipped_curves.png")  # fmt: skip
    rec = recipe(index, verdict_models + [m for m in size_models(index) if m not in verdict_models])
    rec["wire"] = wire_choice(index, verdict_models)
    transfer = out_dir / "transfer_check.json"
    ship(rec, json.loads(transfer.read_text(encoding="utf-8")) if transfer.is_file() else None)
    (out_dir / "recipe.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    update_block(out_dir / "README.md", recipe_text(rec, index, labels), "recipe")
    update_block(out_dir / "README.md", verdict)
    update_block(out_dir / "README.md", verdict_text(index, verdict_models), "tuned")
    update_block(out_dir / "README.md", shipped, "shipped")
    update_block(out_dir / "README.md", finalists_text(index, labels, verdict_models, horizons),
                 "finalists")  # fmt: skip
    update_block(out_dir / "README.md", scale, "scale")
    update_block(out_dir / "README.md",
                 length_text(index, labels, verdict_models, train_tokens(data_dir)), "length")  # fmt: skip
    update_block(out_dir / "README.md", early_gap_text(index, labels, verdict_models), "early")
    carried = out_dir / "product_path" / "summary.json"
    if carried.is_file():  # make quality-product-path's (pipelines.studies.product_path)
        from pipelines.studies.product_path import table_lines

        summary = json.loads(carried.read_text(encoding="utf-8"))
        update_block(out_dir / "README.md", "\n".join(table_lines(summary)), "product")
    if gpu_repo is not None:  # the GPU queue's cells (pipelines.studies.report_gpu)
        from pipelines.studies.report_gpu import gpu_text

        update_block(out_dir / "README.md", gpu_text(gpu_repo, variants, labels), "gpu")
    write_runs_csv(index.all_runs, out_dir / "runs.csv")
    for model in models:
        shown = [REFERENCE, *final] if final else [REFERENCE]
        for steps in horizons:
            plot_curves(index, shown, labels, model, steps, out_dir / f"loss_{model}_t{steps}.png")
    return index


RUN_COLUMNS = ("model", "variant", "steps", "lr_scale", "seed", "final_val_loss", "diverged",
               "spike_steps", "bytes_per_step", "seconds", *STALENESS_KEYS, "step_code",
               "commit")  # fmt: skip


def write_runs_csv(runs: list[RunLog], path: Path) -> None:
    """One row per finished run of every code version (the report's raw material; the
    tables use one version's, named in ``step_code``; "unstamped": before runs recorded it)."""
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(RUN_COLUMNS)
        for run in sorted(runs, key=lambda r: (r.step_code, *dataclasses.astuple(run_key(r)))):
            key = run_key(run)
            sent = [s["bytes"] for s in run.steps if "bytes" in s]
            writer.writerow([
                key.model, key.variant, key.steps, key.lr_scale, key.seed,
                run.final["final_val_loss"], run.final.get("diverged"),
                run.final.get("spike_steps", ""),
                statistics.fmean(sent) if sent else "", run.final.get("seconds", ""),
                *(run.final.get(k, "") for k in STALENESS_KEYS), run.step_code, run.commit or "",
            ])  # fmt: skip
