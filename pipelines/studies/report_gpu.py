"""The README's GPU-scale block: the cells the GPU queue has finished, and what is pending.

The records are the queue's (:mod:`pipelines.studies.gpu_queue`, committed under
``results/quality/gpu/runs``), read with the protocol's own index: one code version (the one
with the most GPU runs, with the versions a replay joined to it), each method at the lr of
its grid with the lowest mean final loss over its seeds, gaps paired by seed.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.studies.gpu_queue import (
    GPU_DATA,
    GPU_RECORDS,
    GPU_SCALE,
    done_runs,
    load_gpu_scale,
    load_recipe,
    plan,
)
from pipelines.studies.quality_config import VariantSpec
from pipelines.studies.report_stats import _fmt_gap, _fmt_loss, gap_cell
from pipelines.studies.run_index import RunIndex

__all__ = ["gpu_text"]


def gpu_text(repo: Path, variants: dict[str, VariantSpec], labels: dict[str, str]) -> str:
    """The block: a row per (model, method) with its grid, runs done, chosen lr, loss and
    gaps to dense AdamS and AdamW; then the runs still pending and the command that runs
    the next ones."""
    scale = load_gpu_scale(repo / GPU_SCALE)
    recipe = load_recipe(repo / "results" / "quality" / "recipe.json")
    queue = plan(scale.models, variants, scale, GPU_DATA, recipe)
    index = RunIndex.load(repo / GPU_RECORDS)
    done = done_runs(repo / GPU_RECORDS / "runs", index.code, queue) if index.runs else {}
    rows, pending = [], []
    for model in scale.models:
        for method in dict.fromkeys(q.variant for q in queue if q.model == model.name):
            cell_runs = [q for q in queue if (q.model, q.variant) == (model.name, method)]
            grid = sorted({q.spec.lr_scale for q in cell_runs})
            finished = sum(q.run_id in done for q in cell_runs)
            if finished < len(cell_runs):
                pending.append(f"{model.name} {labels.get(method, method)} "
                               f"{len(cell_runs) - finished}")  # fmt: skip
            if not finished:
                rows.append(f"| {model.name} | {labels.get(method, method)} | "
                            f"{', '.join(f'x{x:g}' for x in grid)} | 0 of {len(cell_runs)} | "
                            "pending | - | - | - |")  # fmt: skip
                continue
            cell = gap_cell(index, model.name, method, scale.steps)
            to_adamw = gap_cell(index, model.name, method, scale.steps, reference="adamw")
            lr = (
                "-"
                if cell.lr is None
                else f"x{cell.lr:g}" + ("" if cell.closed else " (grid open)")
            )
            rows.append(f"| {model.name} | {labels.get(method, method)} | "
                        f"{', '.join(f'x{x:g}' for x in grid)} | {finished} of {len(cell_runs)} | "
                        f"{lr} | {_fmt_loss(cell.loss)} | {_fmt_gap(cell.gaps)} | "
                        f"{_fmt_gap(to_adamw.gaps)} |")  # fmt: skip
    total = len(queue)
    head = (f"**{len(done)} of {total} GPU-scale runs have finished** "
            f"({', '.join(f'{m.name}' for m in scale.models)}: {scale.steps:,} steps of "
            f"{scale.world_size * scale.batch_per_worker * scale.seq_length:,} tokens, "
            f"W={scale.world_size} simulated workers, lr grids in multiples of {scale.lr:g} "
            f"placed by the recipe, seeds 0 and 1, corpus `{Path(GPU_DATA).name}`"
            + (f"; code version `{index.code}`" if index.runs else "") + ").")  # fmt: skip
    lines = [head, "",
             "| model | method | lr grid | runs done | chosen lr | final val loss | gap to "
             "dense AdamS | gap to AdamW |", "| --- | --- | --- | --- | --- | --- | --- | --- |",
             *rows, ""]  # fmt: skip
    if pending:
        lines.append("Pending (runs left per cell): " + "; ".join(pending) + ". The next "
                     "window runs what fits in 8 minutes: `scripts/gpu_quality.sh --dry-run` "
                     "lists it (results/gpu/README.md: the device command).")  # fmt: skip
    return "\n".join(lines)
