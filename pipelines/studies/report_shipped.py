"""The verdict of what ships (issue 52): SCAPE-90 and SCAPE-99 at the lr multipliers that
``optimizer=scape90|scape99`` apply (``lr_multiplier_by_family`` in conf/optimizer/), against
dense AdamS and dense AdamW each at its own chosen lr, at every horizon run; and tokens to
target: how many steps the shipped arm needs to reach the dense loss of that horizon.

A multiplier is a ratio to dense AdamS's lr, so in the study's terms the shipped arm is SCAPE
at ``multiplier x`` the lr scale chosen for dense AdamS in the same cell (what a user gets who
sets dense AdamS's lr and switches the optimizer). No SCAPE lr is chosen here: where the study
did not run that lr the cell says so rather than taking a neighbour.

Tokens to target reads the periodic validation curve (a fixed subset of the validation
split, the same batches for every arm), averaged over the seeds: the target is the dense
arm's last point, the ratio the first step at which SCAPE's curve is at or below it over the
horizon (1.00 = as fast; 0.80 = 20% fewer steps). Not reached within the horizon, the ratio is
read off the shipped arm's run at the next longer horizon that reaches it (its own, longer
schedule; marked), else given as "> 1" with the horizon it was not reached by.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipelines.studies.recipe import model_family
from pipelines.studies.report_prose import ramp_text
from pipelines.studies.report_stats import (
    ADAMW,
    SHIPPED_CONFIGS,
    VERDICT_METHODS,
    _fmt_gap,
    gap_cell,
)
from pipelines.studies.run_index import REFERENCE, RunIndex, RunKey

__all__ = [
    "ShippedCell",
    "curve_points",
    "shipped_cell",
    "shipped_cells",
    "shipped_multipliers",
    "shipped_table",
    "shipped_verdict_text",
    "LABELS",
    "VERDICT_SEEDS",
    "steps_to_target",
]

LABELS = {variant: label for label, variant, _ in VERDICT_METHODS}  # SCAPE-90, SCAPE-99
CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf" / "optimizer"


def shipped_multipliers(config_dir: Path = CONFIG_DIR) -> dict[str, dict[str, float]]:
    """``{study variant: {family: multiplier}}`` as the shipped configs carry them."""
    out = {}
    for variant, config in SHIPPED_CONFIGS.items():
        cfg = yaml.safe_load((config_dir / f"{config}.yaml").read_text(encoding="utf-8"))
        out[variant] = {f: float(m) for f, m in (cfg.get("lr_multiplier_by_family") or {}).items()}
    return out


@dataclass
class Target:
    """Steps to reach a dense arm's loss, as a ratio to the horizon, and where it was read."""

    ratio: float | None  # None: not reached by any run of the arm at this or a longer horizon
    read_at: int | None = None  # the horizon of the run it was read off (None: not reached)

    def text(self, steps: int) -> str:
        if self.ratio is None:
            return f"> 1 (not reached by step {steps:,})"
        mark = "" if self.read_at == steps else f" ({self.read_at:,}-step run)"
        return f"{self.ratio:.2f}{mark}"


@dataclass
class ShippedCell:
    model: str
    variant: str
    steps: int
    multiplier: float
    lr: float | None  # SCAPE's lr scale: multiplier x dense AdamS's chosen one
    to_adams: list[float] = field(default_factory=list)  # paired % gaps, one per seed
    to_adamw: list[float] = field(default_factory=list)
    adams_closed: bool = False
    adamw_closed: bool = False
    adamw_lr: float | None = None
    target_adamw: Target | None = None
    target_adams: Target | None = None

    @property
    def run(self) -> bool:
        return bool(self.to_adams)


def _mean_curve(index: RunIndex, model: str, variant: str, steps: int, lr: float,
                seeds: list[int]) -> list[tuple[int, float]]:  # fmt: skip
    """The periodic validation loss averaged over ``seeds``, at the steps every seed logged."""
    curves = []
    for seed in seeds:
        run = index.runs.get(RunKey(model, variant, steps, lr, seed))
        if run is None:
            return []
        curves.append({r["step"]: r["val_loss"] for r in run.steps if "val_loss" in r})
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return [(s, statistics.fmean(c[s] for c in curves)) for s in common]


def steps_to_target(index: RunIndex, model: str, variant: str, lr_of: dict[int, float | None],
                    steps: int, reference: str, ref_lr: float) -> Target:  # fmt: skip
    """How many steps ``variant`` needs to reach ``reference``'s loss at ``steps`` (module
    docstring), as a ratio to ``steps``. ``lr_of``: the variant's lr at each horizon."""
    ref_seeds = index.seeds(model, reference, steps, ref_lr)
    for horizon in sorted(h for h in lr_of if h >= steps):
        lr = lr_of[horizon]
        if lr is None:
            continue
        seeds = sorted(set(index.seeds(model, variant, horizon, lr)) & set(ref_seeds))
        if not seeds:
            continue
        reference_curve = _mean_curve(index, model, reference, steps, ref_lr, seeds)
        curve = _mean_curve(index, model, variant, horizon, lr, seeds)
        if not reference_curve or not curve:
            continue
        target = reference_curve[-1][1]
        reached = next((s for s, loss in curve if loss <= target), None)
        if reached is not None:
            return Target(reached / steps, horizon)
    return Target(None)


def shipped_cell(index: RunIndex, model: str, variant: str, steps: int,
                 multiplier: float) -> ShippedCell:  # fmt: skip
    """The shipped arm in one cell: its paired gaps to dense AdamS and AdamW (each at its
    own chosen lr) and its steps to their losses."""
    adams = index.lr_choice(model, REFERENCE, steps)
    cell = ShippedCell(model, variant, steps, multiplier, None)
    if adams is None:
        return cell
    cell.lr, cell.adams_closed = multiplier * adams.lr, adams.closed
    cell.to_adams = index.paired_gaps(model, variant, steps, cell.lr, adams.lr)
    horizons = sorted({k.steps for k in index.runs if (k.model, k.variant) == (model, variant)})
    lr_of = {}
    for h in horizons:
        ref = index.best_lr(model, REFERENCE, h)
        lr_of[h] = None if ref is None else multiplier * ref
    cell.target_adams = steps_to_target(index, model, variant, lr_of, steps, REFERENCE, adams.lr)
    adamw = index.lr_choice(model, ADAMW, steps)
    if adamw is not None:
        cell.adamw_lr, cell.adamw_closed = adamw.lr, adamw.closed
        cell.to_adamw = index.paired_gaps(model, variant, steps, cell.lr, adamw.lr,
                                          reference=ADAMW)  # fmt: skip
        cell.target_adamw = steps_to_target(index, model, variant, lr_of, steps, ADAMW, adamw.lr)
    return cell


def shipped_cells(index: RunIndex, models: list[str], multipliers: dict[str, dict[str, float]],
           steps: int) -> list[ShippedCell]:  # fmt: skip
    return [
        shipped_cell(index, model, variant, steps,
                     multipliers.get(variant, {}).get(model_family(index, model), 1.0))
        for _, variant, _ in VERDICT_METHODS
        for model in models
    ]  # fmt: skip


VERDICT_SEEDS = 3  # the protocol's paired seeds per cell (issue 52)


def _complete(cell: ShippedCell) -> bool:
    """A cell the headline may quote: paired on enough seeds against both dense arms, each
    at the lr its closed grid chose."""
    seeds = min(len(cell.to_adams), len(cell.to_adamw))
    return seeds >= VERDICT_SEEDS and cell.adams_closed and cell.adamw_closed


def _order(gaps: list[float], name: str) -> str:
    ahead, n = sum(g < 0 for g in gaps), len(gaps)
    return (f"ahead of {name} in every seed" if ahead == n else
            f"behind {name} in every seed" if ahead == 0 else
            f"ahead of {name} in {ahead} of {n} seeds")  # fmt: skip


def shipped_verdict_text(index: RunIndex, models: list[str],
                         multipliers: dict[str, dict[str, float]]) -> str:  # fmt: skip
    """The README's verdict, one sentence per sparsity, every figure from ``index``: at the
    longest horizon that meets the protocol (every shipped arm on every model, paired with
    dense AdamS and AdamW on at least ``VERDICT_SEEDS`` seeds, both dense grids closed), else,
    while none does, at the longest where every shipped arm ran (its open grids named)."""
    horizons = sorted({k.steps for k in index.runs}, reverse=True)
    cells_at = {h: shipped_cells(index, models, multipliers, h) for h in horizons}
    steps = next((h for h in horizons if models and all(map(_complete, cells_at[h]))), None)
    if steps is None:
        steps = next((h for h in horizons if models and all(c.run for c in cells_at[h])), None)
    if steps is None:
        return ("No verdict of the shipped configs yet: SCAPE-90 and SCAPE-99 have not run at "
                "the shipped lr multipliers on every model at one horizon. "
                + index.provenance())  # fmt: skip
    cells = {(c.variant, c.model): c for c in cells_at[steps]}
    sentences = []
    for label, variant, sparsity in VERDICT_METHODS:
        parts = []
        for model in models:
            c = cells[(variant, model)]
            grid = [name for name, closed in (("AdamS", c.adams_closed), ("AdamW", c.adamw_closed))
                    if not closed]  # fmt: skip
            against = ""
            if c.to_adamw and c.target_adamw is not None:
                against = (f"; {_fmt_gap(c.to_adamw)} against dense AdamW "
                           f"({_order(c.to_adamw, 'it')}), steps to AdamW's loss "
                           f"{c.target_adamw.text(steps)}")  # fmt: skip
            parts.append(
                f"{_fmt_gap(c.to_adams)} on {model} (lr x{c.multiplier:g} AdamS's; "
                f"{_order(c.to_adams, 'dense AdamS')}"
                + (f"; dense grid open for {' and '.join(grid)}" if grid else "")
                + f"){against}"
            )
        sentences.append(f"As shipped, at {sparsity} sparsity"
                         f"{ramp_text(index, variant, steps, models)} {label} ends " + "; ".join(parts)
                         + ".")  # fmt: skip
    return (
        " ".join(sentences)
        + f" Final validation loss at {steps:,} steps, paired by seed; SCAPE at its config's "
        "lr multiplier over dense AdamS's chosen lr, dense AdamS and AdamW at theirs (chosen "
        "on the split reported; the study's arms send fp32 values, the configs bf16); steps to "
        "AdamW's loss as a ratio to the horizon (1.00: as fast). Per-cell tuned figures "
        f"and every horizon: results/quality/README.md. Runs of code version `{index.code}`"
        + (f" and {len(index.codes) - 1} other versions joined to it by replay"
           if len(index.codes) > 1 else "")
        + "."
    )  # fmt: skip


def shipped_table(index: RunIndex, models: list[str],
                  multipliers: dict[str, dict[str, float]]) -> str:  # fmt: skip
    """Every horizon: the shipped arms' gaps to dense AdamS and AdamW, their steps to the
    dense losses, and, named as such, the per-cell tuned gap to AdamS beside them."""
    rows = [
        "| steps | model | method | lr x AdamS's | gap to AdamS | gap to AdamW | steps to "
        "AdamW's loss | steps to AdamS's loss | per-cell tuned: gap to AdamS (lr x AdamS's) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for steps in sorted({k.steps for k in index.runs}):
        for c in shipped_cells(index, models, multipliers, steps):
            tuned = gap_cell(index, c.model, c.variant, steps)
            adams_lr = index.best_lr(c.model, REFERENCE, steps)
            tuned_text = "-"
            if tuned.gaps and tuned.lr is not None and adams_lr:
                tuned_text = (f"{_fmt_gap(tuned.gaps)} (x{tuned.lr / adams_lr:g}"
                              + ("" if tuned.closed else ", grid open") + ")")  # fmt: skip
            if not c.run:
                rows.append(f"| {steps:,} | {c.model} | {LABELS[c.variant]} | "
                            f"x{c.multiplier:g} | not run at this lr | - | - | - | {tuned_text} |")  # fmt: skip
                continue
            adamw = "-" if not c.to_adamw else _fmt_gap(c.to_adamw) + (
                "" if c.adamw_closed else " (AdamW grid open)")  # fmt: skip
            rows.append(
                f"| {steps:,} | {c.model} | {LABELS[c.variant]} | "
                f"x{c.multiplier:g} | {_fmt_gap(c.to_adams)}"
                + ("" if c.adams_closed else " (AdamS grid open)")
                + f" | {adamw} | "
                + (c.target_adamw.text(steps) if c.target_adamw else "-")
                + " | "
                + (c.target_adams.text(steps) if c.target_adams else "-")
                + f" | {tuned_text} |"
            )
    return "\n".join(rows)


def curve_points(index: RunIndex, model: str, variant: str, steps: int, lr: float | None
                 ) -> list[tuple[int, float]]:  # fmt: skip
    """The seed-mean periodic validation curve of one arm (every seed it ran at ``lr``)."""
    if lr is None:
        return []
    seeds = index.seeds(model, variant, steps, lr)
    return _mean_curve(index, model, variant, steps, lr, seeds) if seeds else []
