"""The report's statistics: paired gaps (a run against the dense reference run with the
same model, horizon and seed: same data order and initial weights, each at its own lr), the
size trend's fit, how often the clip acted, and the comparisons the report makes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from pipelines.studies.run_index import REFERENCE, RunIndex, RunKey, RunLog

__all__ = [
    "ADAMW",
    "CLIP_PAIRS",
    "CONSTANT_99",
    "GapCell",
    "SHIPPED_CONFIGS",
    "SIZE_FAMILY",
    "SizeTrend",
    "T95",
    "VERDICT_FINALISTS",
    "VERDICT_METHODS",
    "VERDICT_MODELS",
    "WIRE_PAIRS",
    "clip_share",
    "gap_cell",
    "paired_rows",
    "policy_clips",
    "size_models",
    "size_trend",
]


def _fmt_gap(gaps: list[float]) -> str:
    if not gaps:
        return "-"
    if any(not math.isfinite(g) for g in gaps):
        bad = sum(not math.isfinite(g) for g in gaps)
        return f"diverged ({bad}/{len(gaps)})"
    if len(gaps) == 1:
        return f"{gaps[0]:+.1f}%"
    return f"{statistics.fmean(gaps):+.1f} ± {statistics.stdev(gaps):.1f}% (n={len(gaps)})"


def _fmt_loss(value: float | None) -> str:
    if value is None:
        return "-"
    return "diverged" if not math.isfinite(value) else f"{value:.3f}"


@dataclass
class GapCell:
    lr: float | None
    gaps: list[float]
    loss: float | None  # mean final val loss over the seeds
    closed: bool = False  # the lr grid has a point on each side of ``lr``


def gap_cell(
    index: RunIndex, model: str, variant: str, steps: int, *, lr_from: int | None = None,
    reference: str = REFERENCE,
) -> GapCell:  # fmt: skip
    """A variant at its lr (lowest mean final loss over the cell's seeds at horizon
    ``lr_from``, default ``steps``), against ``reference`` (dense AdamS) at its own lr chosen
    the same way."""
    pick = lr_from or steps
    choice = index.lr_choice(model, variant, pick)
    ref_lr = index.best_lr(model, reference, pick)
    if choice is None or ref_lr is None:
        return GapCell(None if choice is None else choice.lr, [], None)
    lr = choice.lr
    if not index.seeds(model, variant, steps, lr):
        return GapCell(lr, [], None)
    gaps = index.paired_gaps(model, variant, steps, lr, ref_lr, reference)
    finals = [
        index.final(RunKey(model, variant, steps, lr, s))
        for s in index.seeds(model, variant, steps, lr)
    ]
    finals = [f for f in finals if f is not None]
    loss = statistics.fmean(finals) if finals else None
    return GapCell(lr, gaps, loss, choice.closed)


def _gap_stats(index: RunIndex, model: str, variant: str, steps: int) -> tuple[float, ...] | None:
    """Mean, min and max over seeds of the paired gap (finite ones), None when none."""
    gaps = [g for g in gap_cell(index, model, variant, steps).gaps if math.isfinite(g)]
    return (statistics.fmean(gaps), min(gaps), max(gaps)) if gaps else None


VERDICT_MODELS = ("llama", "gpt")  # the two small models every finalist is run on
WIRE_PAIRS = (("scape90", "scape90_bf16"), ("scape99", "scape99_bf16"))  # (fp32, bf16 wire)
# (clipped, unclipped) at the clipped one's lr: the clipping policy's effect on each finalist
CLIP_PAIRS = (
    ("adams", "adams_noclip"),
    ("scape90", "scape90_noclip"),
    ("scape99", "scape99_noclip"),
)


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def paired_rows(
    index: RunIndex, models: list[str], steps: int, pairs: tuple[tuple[str, str], ...]
) -> list[dict[str, Any]]:
    """Each (base, changed) variant pair at one horizon, per model, paired by seed at the
    changed runs' lr (the base's chosen one, ``lr_of``): each side's mean final loss, the
    mean and sd of the per-seed difference changed - base (nats), the base's sd over seeds,
    ``within`` (|mean difference| <= that sd) and bytes per step of each."""
    rows = []
    for model in models:
        for base, changed in pairs:
            lrs = sorted({k.lr_scale for k in index.runs
                          if (k.model, k.variant, k.steps) == (model, changed, steps)})  # fmt: skip
            for lr in lrs:
                seeds = [s for s in index.seeds(model, changed, steps, lr)
                         if RunKey(model, base, steps, lr, s) in index.runs]  # fmt: skip
                if not seeds:
                    continue
                keys = {v: [RunKey(model, v, steps, lr, s) for s in seeds] for v in (base, changed)}
                loss = {v: [index.final(k) for k in ks] for v, ks in keys.items()}
                diff = [b - a for a, b in zip(loss[base], loss[changed], strict=True)]  # type: ignore[operator]
                sd = _sd(loss[base])  # type: ignore[arg-type]
                rows.append({
                    "model": model, "variant": base, "changed": changed, "lr": lr, "seeds": seeds,
                    "base": statistics.fmean(loss[base]), "changed_loss": statistics.fmean(loss[changed]),  # type: ignore[arg-type]
                    "diff": statistics.fmean(diff), "diff_sd": _sd(diff), "base_sd": sd,
                    "within": abs(statistics.fmean(diff)) <= sd,
                    "bytes": {v: index.runs[ks[0]].steps[-1].get("bytes") for v, ks in keys.items()},
                })  # fmt: skip
    return rows


SIZE_FAMILY = "llama"  # the family run at three sizes


def _lr_text(cell: GapCell) -> str:
    return "-" if cell.lr is None else f"{cell.lr:g}" + ("" if cell.closed else ", grid open")


def size_models(index: RunIndex) -> list[str]:
    """The :data:`SIZE_FAMILY` models of the index, smallest first."""
    models = {r.model for r in index.runs.values()
              if r.header.get("family", SIZE_FAMILY) == SIZE_FAMILY}  # fmt: skip
    return sorted(models, key=lambda m: index.params(m) or 0)


# The verdict's methods are the shipped configs (conf/optimizer/<config>.yaml), each as the
# study variant that runs it: (label, variant, sparsity). The shipped SCAPE-99 ramps from 90%
# (the early-gap search's winner under the protocol); the constant 99% stays a finalist.
VERDICT_METHODS = (("SCAPE-90", "scape90", "90%"), ("SCAPE-99", "scape99_ramp", "99%"))
SHIPPED_CONFIGS = {"scape90": "scape90", "scape99_ramp": "scape99"}  # variant -> config
CONSTANT_99 = "scape99"  # SCAPE-99 without a ramp: the early gap's and the bytes' reference
ADAMW = "adamw"  # the other dense reference: the verdict states SCAPE's gap to it too

# Student t, two-sided 95%, df = 1..10 (df > 10 uses the last: slightly wide, never narrow)
T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


@dataclass
class SizeTrend:
    """One method's paired gap to dense AdamS against log10(parameters) at one horizon:
    ordinary least squares over every seed's gap at every size (each size at its own lrs)."""

    variant: str
    steps: int
    points: list[tuple[int, float]]  # (parameters, gap %), one per seed and size

    def __post_init__(self) -> None:
        xy = [(math.log10(p), g) for p, g in self.points]
        self.xbar, ybar = statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)
        self.sxx = sum((x - self.xbar) ** 2 for x, _ in xy)
        self.slope = sum((x - self.xbar) * (y - ybar) for x, y in xy) / self.sxx
        self.intercept = ybar - self.slope * self.xbar
        df = len(xy) - 2
        ssr = sum((y - self.intercept - self.slope * x) ** 2 for x, y in xy)
        self.resid_var = ssr / df if df > 0 else None
        self.t = T95[min(df, len(T95)) - 1] if df > 0 else math.inf

    def slope_interval(self) -> tuple[float, float] | None:
        """95% interval of the slope (gap points per 10x parameters); None with no residual
        degrees of freedom."""
        if self.resid_var is None:
            return None
        half = self.t * math.sqrt(self.resid_var / self.sxx)
        return self.slope - half, self.slope + half

    def interval(self, params: int) -> tuple[float, float] | None:
        """95% interval of the fitted line (the mean gap) at ``params``, were it straight."""
        if self.resid_var is None:
            return None
        x = math.log10(params)
        fit = self.intercept + self.slope * x
        half = self.t * math.sqrt(self.resid_var * (1 / len(self.points)
                                                     + (x - self.xbar) ** 2 / self.sxx))  # fmt: skip
        return fit - half, fit + half


def _closed(index: RunIndex, model: str, variant: str, steps: int) -> bool:
    return (
        gap_cell(index, model, variant, steps).closed
        and gap_cell(index, model, REFERENCE, steps).closed
    )


def size_trend(index: RunIndex, variant: str, steps: int) -> SizeTrend | None:
    """The :class:`SizeTrend` of ``variant`` over the :data:`SIZE_FAMILY` models that ran it
    at ``steps`` (paired, each at the lr chosen over its seeds), from the sizes where its lr
    grid and dense AdamS's are both closed (an edge lr would make the gap the grid's, not
    the method's); None under two such sizes."""
    points = [(index.params(m), g) for m in size_models(index) if _closed(index, m, variant, steps)
              for g in gap_cell(index, m, variant, steps).gaps if math.isfinite(g)]  # fmt: skip
    points = [(p, g) for p, g in points if p]
    if len({p for p, _ in points}) < 2:
        return None
    return SizeTrend(variant, steps, points)  # type: ignore[arg-type]


def clip_share(run: RunLog, clip: float) -> tuple[float, float] | None:
    """(share of the run's logged steps whose pre-clip norm exceeded ``clip``, their median
    pre-clip norm); None when it logged no norm. Dense logs its reduced gradient's norm,
    SCAPE its update q's, both before clipping: the share is how often the clip acted."""
    norms = [s["grad_norm"] for s in run.steps
             if isinstance(s.get("grad_norm"), float) and math.isfinite(s["grad_norm"])]  # fmt: skip
    if not norms:
        return None
    return sum(n > clip for n in norms) / len(norms), statistics.median(norms)


def policy_clips(index: RunIndex, variants: list[str] | None = None) -> list[float]:
    """The clip norms the runs (of ``variants``, default all) recorded in their settings, a
    variant with its own clip norm (the policy's control arm) excepted."""
    settings = [r.header.get("settings") or {} for k, r in index.runs.items()
                if variants is None or k.variant in variants]  # fmt: skip
    return sorted({s.get("scale", {}).get("clip_grad") for s in settings
                   if s.get("variant", {}).get("clip_grad") is None} - {None})  # fmt: skip


# with dense AdamS, the opening table's rows
VERDICT_FINALISTS = ("adamw", "scape90", CONSTANT_99, "scape99_ramp")
