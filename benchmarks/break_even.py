"""`make bench-break-even`: where SCAPE pays -- a break-even map against the paper's x3.26.

The projected per-step speed-up of SCAPE-99 (and -90) over dense AdamS for Llama-1.8B on 32
ranks, over per-rank link bandwidth x tokens per GPU per step, without and with overlap: every
cell is :func:`benchmarks.projection.project_model` (``break_even.{png,md,csv,json}``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import cli
from benchmarks.projection import PAPER, Assumptions, calibrated, project_model

__all__ = ["break_even_bandwidth", "grid", "main", "needed_ratio", "ratio_curve"]

MODEL = "llama-1.8b"
TARGET = PAPER["speedup_llama_1_8b"]
TABLE_TOKENS = [1024, 2048, 4096, 8192, 16384, 32768]
TABLE_BANDWIDTHS = [1.0, 10.0, 25.0, 100.0, 200.0, 400.0]
# 1 .. 400 Gbit/s, 16 per decade, plus the table's columns
BANDWIDTHS = sorted({round(10 ** (i / 16), 4) for i in range(0, 42) if 10 ** (i / 16) <= 400}
                    | set(TABLE_BANDWIDTHS))  # fmt: skip
TOKENS = [int(round(1024 * 2 ** (i / 4))) for i in range(0, 21)]  # 1k .. 32k, 4 per octave
MODES = ("no_overlap", "full_overlap")
METHODS = ("scape-99", "scape-90")


def _cell(a: Assumptions, cal: dict | None, bw: float, tokens: int) -> dict[str, Any]:
    p = project_model(MODEL, replace(a, link_gbit=bw), tokens, cal)
    dense_xfer = p["dense_comm_s"]["grad_sync"] + p["dense_comm_s"]["param_sync"]
    compute = p["dense_step_s"]["no_overlap"] - dense_xfer  # compute + dense optimizer work
    out = {"link_gbit": bw, "tokens_per_gpu": tokens, "compute_s": compute,
           "dense_comm_s": dense_xfer, "comm_over_compute": dense_xfer / compute}  # fmt: skip
    for m in METHODS:
        for mode in MODES:
            out[f"{m}/{mode}"] = p["scape"][m][f"speedup_{mode}"]
    return out


def grid(a: Assumptions, cal: dict | None = None, bandwidths: list[float] = BANDWIDTHS,
         tokens: list[int] = TOKENS) -> list[dict]:  # fmt: skip
    """One projected cell per (bandwidth, tokens per GPU)."""
    return [_cell(a, cal, bw, t) for t in tokens for bw in bandwidths]


def break_even_bandwidth(cells: list[dict], key: str, tokens: int,
                         target: float = TARGET) -> float | None:  # fmt: skip
    """The highest per-rank bandwidth (Gbit/s) at which ``key``'s speed-up still reaches
    ``target`` for this batch (log-interpolated between grid points); None if it never does
    on the grid, ``inf`` if it does even at the grid's highest bandwidth."""
    row = sorted((c for c in cells if c["tokens_per_gpu"] == tokens), key=lambda c: c["link_gbit"])
    if not row or row[0][key] < target:
        return None
    if row[-1][key] >= target:
        return math.inf
    for lo, hi in zip(row, row[1:], strict=False):
        if lo[key] >= target > hi[key]:
            f = (math.log(lo[key]) - math.log(target)) / (math.log(lo[key]) - math.log(hi[key]))
            a, b = math.log(lo["link_gbit"]), math.log(hi["link_gbit"])
            return math.exp(a + f * (b - a))
    return None


def ratio_curve(a: Assumptions, cal: dict | None = None,
                tokens: int = 16384) -> list[dict]:  # fmt: skip
    """Speed-up against dense comm/compute: the map's row at ``tokens``, 0.05-3000 Gbit/s."""
    bws = [10 ** (i / 8) for i in range(-11, 29)]
    return sorted((_cell(a, cal, bw, tokens) for bw in bws),
                  key=lambda c: c["comm_over_compute"])  # fmt: skip


def needed_ratio(curve: list[dict], key: str, target: float = TARGET) -> float | None:
    """The smallest dense comm/compute ratio at which ``key`` reaches ``target``."""
    for lo, hi in zip(curve, curve[1:], strict=False):
        if lo[key] < target <= hi[key]:
            f = (target - lo[key]) / (hi[key] - lo[key])
            return lo["comm_over_compute"] + f * (hi["comm_over_compute"] - lo["comm_over_compute"])
    return None


def plot(cells: list[dict], out: Path) -> None:
    import matplotlib
    from PIL import Image

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import NullFormatter

    bws = sorted({c["link_gbit"] for c in cells})
    toks = sorted({c["tokens_per_gpu"] for c in cells})
    at = {(c["link_gbit"], c["tokens_per_gpu"]): c for c in cells}
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    norm = LogNorm(vmin=0.9, vmax=max(c[f"scape-99/{m}"] for c in cells for m in MODES))
    for ax, mode, title in ((axes[0], "no_overlap", "no overlap"),
                            (axes[1], "full_overlap", "with Megatron's overlap")):  # fmt: skip
        z = np.array([[at[(b, t)][f"scape-99/{mode}"] for b in bws] for t in toks])
        z90 = np.array([[at[(b, t)][f"scape-90/{mode}"] for b in bws] for t in toks])
        mesh = ax.pcolormesh(bws, toks, z, norm=norm, cmap="viridis", shading="gouraud")
        cs = ax.contour(bws, toks, z, levels=[1.25, 2.0], colors="white", linewidths=0.8)
        ax.clabel(cs, fmt=lambda v: f"x{v:g}", fontsize=8)
        if z.max() >= TARGET:
            ax.contour(bws, toks, z, levels=[TARGET], colors="red", linewidths=2.2)
        if z90.max() >= TARGET:
            ax.contour(bws, toks, z90, levels=[TARGET], colors="orange", linewidths=1.8,
                       linestyles="--")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="per-rank link bandwidth (Gbit/s)",
               ylabel="tokens per GPU per step",
               title=f"SCAPE-99 speed-up over dense AdamS, {title}")  # fmt: skip
        ax.set_yticks(TABLE_TOKENS, [f"{t // 1024}k" for t in TABLE_TOKENS])
        ax.set_xticks([1, 10, 100, 400], ["1", "10", "100", "400"])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        bar = fig.colorbar(mesh, ax=ax, label="speed-up per step")
        ticks = [t for t in (1, 2, TARGET, 5, 10, 20, 50, 100) if t <= norm.vmax]
        bar.set_ticks(ticks, labels=[f"x{t:g}" for t in ticks])
        bar.ax.yaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(f"Llama-1.8B, 32 ranks: projected per-step speed-up (red: SCAPE-99 at the paper's "
                 f"x{TARGET}; dashed orange: SCAPE-90 at x{TARGET})", fontsize=10)  # fmt: skip
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110)
    plt.close(fig)
    # a 256-colour palette: the same figure in a third of the bytes (the repository keeps it)
    Image.open(buf).convert("RGB").quantize(256).save(out, optimize=True)


def _bw(x: float | str | None) -> str:
    if isinstance(x, str):
        x = math.inf
    if x is None:
        return "never (< x3.26 even at 1 Gbit/s)"
    return ">= 400 (all)" if math.isinf(x) else f"<= {x:.0f}" if x >= 10 else f"<= {x:.1f}"


def summarize(cells: list[dict], curve: list[dict], a: Assumptions) -> dict:
    at = {(c["link_gbit"], c["tokens_per_gpu"]): c for c in cells}
    be = {f"{m}/{mode}": {t: break_even_bandwidth(cells, f"{m}/{mode}", t) for t in TABLE_TOKENS}
          for m in METHODS for mode in MODES}  # fmt: skip
    be_json = {k: {t: "above the grid" if v is not None and math.isinf(v) else v
                   for t, v in row.items()} for k, row in be.items()}  # fmt: skip
    needed = {f"{m}/{mode}": needed_ratio(curve, f"{m}/{mode}") for m in METHODS for mode in MODES}
    ndr = {t: {k: at[(400.0, t)][k] for k in needed} for t in TABLE_TOKENS}
    top = max(c["link_gbit"] for c in cells)
    max_tokens = {k: max((c["tokens_per_gpu"] for c in cells
                          if c["link_gbit"] == top and c[k] >= TARGET), default=None)
                  for k in needed}  # fmt: skip
    return {"assumptions": asdict(a), "model": MODEL, "world_size": a.world_size,
            "target": TARGET, "break_even_gbit": be_json, "needed_comm_over_compute": needed,
            "speedup_at_400gbit": ndr, "max_tokens_at_400gbit": max_tokens,
            "comm_over_compute_at": {f"{b}gbit/{t}": at[(float(b), t)]["comm_over_compute"]
                                     for b in (100, 400) for t in TABLE_TOKENS}}  # fmt: skip


def in_words(summary: dict) -> str:
    """Which settings the paper's speed-up needs, every figure from the summary."""
    need, top, be = (summary["needed_comm_over_compute"], summary["max_tokens_at_400gbit"],
                     summary["break_even_gbit"])  # fmt: skip
    link, tokens_per_gpu = (summary["assumptions"][k] for k in ("link_gbit", "tokens_per_gpu"))
    smallest = min(int(t) for t in be["scape-99/no_overlap"])

    def ratio(k: str) -> str:
        return "never" if need[k] is None else f"{need[k]:.1f}x"

    def tokens(k: str) -> str:
        if top[k] is None:
            return f"no batch of {smallest // 1024}k or more"
        return f"at most {top[k]:,} tokens per GPU per step"

    def bw(k: str) -> str:
        row = {int(t): v for t, v in be[k].items()}  # int keys, also after a JSON round trip
        text = _bw(row[tokens_per_gpu]).replace("<=", "at most").replace(">=", "at least")
        return f"{text} Gbit/s"

    return (
        f"The paper's x{summary['target']} for {summary['model']} needs the dense exchange to "
        f"take at least {ratio('scape-99/no_overlap')} the compute for SCAPE-99 without overlap "
        f"({ratio('scape-99/full_overlap')} with Megatron's overlap; SCAPE-90: "
        f"{ratio('scape-90/no_overlap')} / {ratio('scape-90/full_overlap')}). On Vista-like "
        f"{link:g} Gbit/s links that means {tokens('scape-99/no_overlap')} for SCAPE-99 without "
        f"overlap ({tokens('scape-99/full_overlap')} with it); at {tokens_per_gpu // 1024}k tokens "
        f"per GPU it needs per-rank links of {bw('scape-99/no_overlap')} "
        f"({bw('scape-99/full_overlap')} with overlap). Where the dense exchange is a small part "
        "of the step (large batches, fast links, the exchange overlapped), SCAPE's per-step gain "
        "shrinks towards x1."
    )


def markdown(summary: dict, cells: list[dict]) -> str:
    be, need = summary["break_even_gbit"], summary["needed_comm_over_compute"]
    lines = [f"# Break-even map: SCAPE vs dense AdamS, {MODEL}, {summary['world_size']} ranks",
             "", "Written by `python -m benchmarks.break_even` (`make bench-break-even`); "
             "the figure is `break_even.png`, every cell in `break_even.csv`.", "",
             f"Highest per-rank link bandwidth (Gbit/s) at which the projected speed-up still "
             f"reaches the paper's x{TARGET}:", "",
             "| tokens per GPU per step | SCAPE-99 | SCAPE-99 with overlap | SCAPE-90 | SCAPE-90 with overlap |",
             "|---|---|---|---|---|"]  # fmt: skip
    for t in TABLE_TOKENS:
        lines.append(f"| {t:,} | " + " | ".join(_bw(be[f"{m}/{mode}"][t]) for m in METHODS
                                                for mode in MODES) + " |")  # fmt: skip
    lines += ["", in_words(summary)]
    lines += ["", f"Dense communication / compute needed for x{TARGET} (no overlap: dense "
              "exchange after backward; overlap: hidden up to the compute time): "
              + ", ".join(f"{k.replace('/full_overlap', ' with overlap').replace('/no_overlap', '')} "
                          f"{'never' if v is None else f'{v:.1f}'}" for k, v in need.items()) + ".",
              "", "Projected speed-up (SCAPE-99 / with overlap) by bandwidth and batch:", "",
              "| tokens per GPU | " + " | ".join(f"{b} Gbit/s" for b in TABLE_BANDWIDTHS) + " |",
              "|---|" + "---|" * len(TABLE_BANDWIDTHS)]  # fmt: skip
    at = {(c["link_gbit"], c["tokens_per_gpu"]): c for c in cells}
    for t in TABLE_TOKENS:
        row = (at[(float(b), t)] for b in TABLE_BANDWIDTHS)
        lines.append(f"| {t:,} | " + " | ".join(
            f"x{c['scape-99/no_overlap']:.2f} / x{c['scape-99/full_overlap']:.2f}" for c in row) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, timing=False)
    parser.add_argument("--bench-dir", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    d = args.bench_dir
    a, cal = calibrated()  # the projection's: the GPU check's MFU and kernels when there is one
    cells = grid(a, cal)
    curve = ratio_curve(a, cal)
    summary = summarize(cells, curve, a)
    plot(cells, d / "break_even.png")
    with open(d / "break_even.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cells[0]))
        w.writeheader()
        w.writerows(cells)
    (d / "break_even.md").write_text(markdown(summary, cells))
    (d / "break_even.json").write_text(json.dumps(summary, indent=1, default=str))
    for k, v in summary["break_even_gbit"].items():
        print(f"  {k:24s} x{TARGET} up to: " + ", ".join(f"{t // 1024}k {_bw(b)}" for t, b in v.items()))  # fmt: skip
    print(f"wrote {d}/break_even.png, .md, .csv, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
