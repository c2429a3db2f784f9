"""The report's figures: the gap against training steps (and size), and the loss curves."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pipelines.studies.report_shipped import LABELS, ShippedCell, curve_points
from pipelines.studies.report_stats import ADAMW, SIZE_FAMILY, _gap_stats
from pipelines.studies.run_index import REFERENCE, RunIndex, RunKey

__all__ = ["plot_curves", "plot_gap_vs_steps", "plot_shipped"]

COLORS = {"scape90": "tab:blue", "scape99_ramp": "tab:orange"}  # one colour per arm, every panel


def plot_gap_vs_steps(
    index: RunIndex,
    variants: list[str],
    labels: dict[str, str],
    models: list[str],
    horizons: list[int],
    path: Path,
    *,
    sizes: list[str] | None = None,
) -> None:
    """Paired gap to AdamS against steps (log axis), mean and min-max over seeds, one panel
    per model; with two or more ``sizes`` (one family's models), a last panel of the gap
    against parameters (log axis), one line per variant and horizon."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    params = {m: index.params(m) for m in sizes or []}
    by_size = len(params) >= 2 and all(params.values())
    panels = len(models) + by_size
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8), squeeze=False)
    lines: list[tuple[Any, str, list[float], list[tuple[float, ...]]]] = []
    for ax, model in zip(axes[0], models, strict=False):
        for variant in variants:
            stats = [(h, _gap_stats(index, model, variant, h)) for h in horizons]
            lines.append((ax, variant, [h for h, g in stats if g], [g for _, g in stats if g]))
        ax.set_xscale("log")
        ax.set_xticks(horizons, [str(h) for h in horizons])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("training steps (log)")
        ax.set_title(f"{model}: gap to AdamS, each at its best lr")
    if by_size:
        ax = axes[0][-1]
        for variant in variants:
            for steps in horizons:
                stats = [(params[m], _gap_stats(index, m, variant, steps)) for m in params]
                xs, gs = [x for x, g in stats if g], [g for _, g in stats if g]
                if len(xs) >= 2:
                    lines.append((ax, f"{variant}@{steps}", xs, gs))
        ax.set_xscale("log")
        # The sizes run as the ticks: matplotlib's minor log labels overlap at these spans.
        ax.set_xticks(list(params.values()), [index.params_text(m) for m in params])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"parameters ({SIZE_FAMILY}, log)")
        ax.set_title("gap to AdamS against model size, each at its best lr")
    for ax, name, xs, gs in lines:
        if not xs or name == REFERENCE:
            continue
        variant, _, steps = name.partition("@")
        label = labels.get(variant, variant) + (f", {int(steps):,} steps" if steps else "")
        style = "--" if "99" in variant else "-"
        (line,) = ax.plot(xs, [g[0] for g in gs], style, marker="o", label=label)
        ax.fill_between(xs, [g[1] for g in gs], [g[2] for g in gs], color=line.get_color(),
                        alpha=0.12)  # fmt: skip
    for ax in axes[0]:
        ax.axhline(0.0, color="black", lw=0.8)
        for target in (1.0, 3.0):
            ax.axhline(target, color="grey", lw=0.6, ls=":")
        ax.set_ylabel("paired gap to dense AdamS (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(
    index: RunIndex, variants: list[str], labels: dict[str, str], model: str, steps: int, path: Path
) -> None:
    """Validation loss against steps at one horizon, each variant at the lr chosen over its
    seeds at that horizon, mean and min-max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drawn = 0
    for variant in variants:
        lr = index.best_lr(model, variant, steps)
        if lr is None:
            continue
        runs = [
            index.runs[RunKey(model, variant, steps, lr, s)]
            for s in index.seeds(model, variant, steps, lr)
        ]
        curves = [
            [(r["step"], r["val_loss"]) for r in run.steps if "val_loss" in r] for run in runs
        ]
        curves = [c for c in curves if c]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [p[0] for p in curves[0][:n]]
        ys = [[c[i][1] for c in curves] for i in range(n)]
        (line,) = ax.plot(xs, [statistics.fmean(y) for y in ys],
                          label=f"{labels.get(variant, variant)} (lr x{lr:g}, n={len(curves)})")  # fmt: skip
        if len(curves) > 1:
            ax.fill_between(
                xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.15
            )
        drawn += 1
    if not drawn:
        plt.close(fig)
        return
    finals = [ln.get_ydata()[-1] for ln in ax.get_lines()]
    ax.set_ylim(min(finals) - 0.3, max(finals) + 1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title(f"{model}, {steps} steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_shipped(index: RunIndex, cells: dict[int, list[ShippedCell]], labels: dict[str, str],
                 models: list[str], path: Path) -> None:  # fmt: skip
    """The shipped arms' validation curves beside dense AdamW and AdamS (each at its chosen
    lr), seed means, one panel per model (rows) and horizon (columns); a dashed line at
    AdamW's last point, and where a shipped arm's curve first reaches it, a dot labelled
    with the steps-to-target ratio (``cells``: :func:`~pipelines.studies.report_shipped.
    shipped_cell` per horizon)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = sorted(cells)
    if not horizons or not models:
        return
    fig, axes = plt.subplots(len(models), len(horizons), squeeze=False,
                             figsize=(3.6 * len(horizons), 3.0 * len(models)))  # fmt: skip
    for row, model in enumerate(models):
        for col, steps in enumerate(horizons):
            ax = axes[row][col]
            target = None
            for variant, style in ((ADAMW, "k-"), (REFERENCE, "k:")):
                points = curve_points(index, model, variant, steps,
                                      index.best_lr(model, variant, steps))  # fmt: skip
                if points:
                    ax.plot(*zip(*points, strict=True), style, lw=1.2,
                            label=f"{labels.get(variant, variant)} (chosen lr)")  # fmt: skip
                    target = points[-1][1] if variant == ADAMW else target
            for cell in (c for c in cells[steps] if c.model == model):
                points = curve_points(index, model, cell.variant, steps, cell.lr)
                if not points:
                    continue
                (line,) = ax.plot(*zip(*points, strict=True), lw=1.2,
                                  color=COLORS.get(cell.variant),
                                  label=f"{LABELS[cell.variant]} shipped "
                                  f"(x{cell.multiplier:g})")  # fmt: skip
                if target is None:
                    continue
                reached = next(((s, v) for s, v in points if v <= target), None)
                ratio = cell.target_adamw.text(steps) if cell.target_adamw else "-"
                if reached is not None:
                    ax.plot(*reached, "o", color=line.get_color())
                ax.annotate(f"to AdamW: {ratio}", xy=(0.98, 0.9 - 0.08 * len(ax.texts)),
                            xycoords="axes fraction", ha="right", fontsize=6,
                            color=line.get_color())  # fmt: skip
            if target is not None:
                ax.axhline(target, color="grey", ls="--", lw=0.8)
                ax.set_ylim(target - 0.4, target + 1.2)
            ax.set_title(f"{model}, {steps:,} steps", fontsize=8)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3)
            if row == len(models) - 1:
                ax.set_xlabel("step", fontsize=7)
            if col == 0:
                ax.set_ylabel("validation loss (nats)", fontsize=7)
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
