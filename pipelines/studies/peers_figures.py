"""The peers study's figures: the loss-for-bytes frontier (``frontier.png``, from the
frontier's JSON alone) and each method's loss against bytes sent (``loss_vs_bytes.png``).
:mod:`pipelines.studies.peers_report` computes what they show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_frontier", "plot_loss_vs_bytes"]


def plot_frontier(doc: dict[str, Any], path: Path) -> None:
    """Two panels: the gap to dense AdamS (mean, min-max bar over seeds) against bytes per rank
    per step counted here, and against the bytes projected to the paper's shapes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    s, u = doc["setting"], doc["unigram"]
    ref = next((m for m in doc["methods"] if m["method"] == doc["reference"]), None)
    shapes = s["paper_shapes"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    markers = ["o", "s", "^", "D"]
    colors = plt.get_cmap("tab10").colors
    for i, m in enumerate(doc["methods"]):
        g = m["gap_pct"]
        if not g["n"]:
            continue
        yerr = [[g["mean"] - g["min"]], [g["max"] - g["mean"]]]
        color = colors[i % len(colors)]
        x = m["bytes"]["measured_mean"]
        axes[0].errorbar([x], [g["mean"]], yerr=yerr, fmt="o", color=color, capsize=3,
                         label=m["label"] + ("" if m["closed"] else " (grid open)"))  # fmt: skip
        axes[0].annotate(m["label"], (x, g["mean"]), textcoords="offset points", xytext=(5, 4),
                         fontsize=7, color=color)  # fmt: skip
        for j, shape in enumerate(shapes):
            xp = m["bytes"]["projected"].get(shape["name"])
            if xp:
                axes[1].errorbar([xp], [g["mean"]], yerr=yerr, fmt=markers[j % len(markers)],
                                 color=color, capsize=3, mfc="none" if j else color)  # fmt: skip
    for ax in axes:
        ax.set_xscale("log")
        ax.axhline(0.0, color="black", lw=0.8)
        if ref and ref["final"]["n"]:
            level = 100.0 * (u["nats"] / ref["final"]["mean"] - 1.0)
            ax.axhline(level, color="gray", ls="--", lw=1)
            ax.text(ax.get_xlim()[0] if ax.has_data() else 1, level,
                    f" unigram level ({u['nats']:.2f} nats)", va="bottom", fontsize=8, color="gray")  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_xlabel(f"bytes per rank per step, counted ({s['model']}, {s['ranks']} ranks; log)")
    axes[0].set_ylabel("final val loss vs dense AdamS (%, mean and min-max over seeds)")
    axes[0].set_title(f"{s['steps']} steps, each method at its chosen lr")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7, loc="upper right")
    world = shapes[0]["world_size"] if shapes else 0
    axes[1].set_xlabel(f"bytes per rank per step, projected at {world} ranks (log)")
    handles = [Line2D([], [], ls="", marker=markers[j % len(markers)], color="black",
                      mfc="none" if j else "black", label=f"{p['name']} ({p['params'] / 1e6:,.0f}M)")
               for j, p in enumerate(shapes)]  # fmt: skip
    axes[1].legend(handles=handles, fontsize=8, loc="upper right")
    axes[1].set_title("the same gaps at the paper's shapes (steady-state byte formulas)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss_vs_bytes(curves: list[tuple[str, list[tuple[float, float]]]], path: Path) -> None:
    """Each method's validation loss (mean over seeds) against cumulative bytes sent per rank:
    ``curves`` holds (label, [(bytes, loss), ...]) per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, curve in curves:
        xs = [b / 1e6 for b, _ in curve]
        ax.plot(xs, [loss for _, loss in curve], marker="o", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative MB sent per rank (log)")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.set_title("Validation loss against bytes sent")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
