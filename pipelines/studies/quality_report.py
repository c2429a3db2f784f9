"""The quality study's report: every finished run indexed by (model, variant, horizon, lr,
seed), the tables and figures of the reconstruction search, and the cost of each reading.

Every number is read from the finished runs' JSONL files under ``<out_dir>/runs`` (unfinished
``.partial`` files are ignored), so a report can be written at any time. Gaps are paired: a
run against the dense AdamS run with the same model, horizon and seed (same data order and
initial weights), each at its own best lr of the grid.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.studies.protocol import (
    UNSTAMPED,
    LrChoice,
    choose_lr,
    code_classes,
    load_equivalences,
    verdict_code,
)
from pipelines.studies.quality_config import ReadingRow, VariantSpec
from pipelines.studies.quality_run import FINAL, STALENESS_KEYS
from pipelines.studies.reading_costs import reading_cost
from pipelines.studies.run_store import run_texts

__all__ = [
    "RunIndex",
    "RunKey",
    "RunLog",
    "cost_table",
    "gap_table",
    "load_runs",
    "parse_run",
    "read_run",
    "lr_table",
    "overview_table",
    "plot_gap_vs_steps",
    "staleness_table",
    "write_report",
]


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

    @property
    def step_code(self) -> str:
        """The code version that made the run (:func:`protocol.step_code`)."""
        return (self.header.get("code") or {}).get("step_code") or UNSTAMPED

    @property
    def commit(self) -> str | None:
        return (self.header.get("code") or {}).get("commit")


def parse_run(text: str) -> RunLog | None:
    """A run's JSONL log; None when the run has not finished."""
    lines = [json.loads(line) for line in text.splitlines()]
    if len(lines) < 2 or lines[-1].get("event") != FINAL:
        return None
    return RunLog(lines[0], lines[1:-1], lines[-1])


def read_run(path: Path) -> RunLog | None:
    """A run's JSONL file; None when the run has not finished."""
    return parse_run(path.read_text(encoding="utf-8"))


def load_runs(runs_dir: Path) -> list[RunLog]:
    """Every finished run under ``runs_dir``: each code version's folder or archive, and the
    unstamped runs made before runs recorded their code, at the top
    (:func:`pipelines.studies.run_store.run_texts`)."""
    runs = (parse_run(text) for _, text in run_texts(runs_dir))
    return [r for r in runs if r is not None]


REFERENCE = "adams"


@dataclass(frozen=True)
class RunKey:
    model: str
    variant: str
    steps: int
    lr_scale: float
    seed: int


def run_key(run: RunLog) -> RunKey:
    h = run.header
    steps = h.get("steps") or h["settings"]["scale"]["steps"]
    return RunKey(h["model"], h["variant"], int(steps), float(h.get("lr_scale", 1.0)), h["seed"])


class RunIndex:
    """The runs of ONE code version, by key: the version with the most runs unless ``code``
    names one (:func:`protocol.verdict_code`), with the versions a replay showed to compute
    the same bits (``equivalences``, :func:`protocol.load_equivalences`); the others are
    counted in ``left_out``."""

    def __init__(
        self,
        runs: list[RunLog],
        code: str | None = None,
        equivalences: list[dict[str, Any]] | None = None,
    ) -> None:
        self.all_runs = runs  # every code version's, for runs.csv
        self.equivalences = equivalences or []
        classes = code_classes(self.equivalences)
        self.code = code or verdict_code((r.step_code for r in runs), classes)
        self.codes = classes.get(self.code, frozenset({self.code}))
        own = Counter(r.step_code for r in runs)
        # the named version's run first, where an equivalent version has the same key
        kept = sorted((r for r in runs if r.step_code in self.codes),
                      key=lambda r: (r.step_code != self.code, -own[r.step_code], r.step_code))  # fmt: skip
        self.left_out = Counter(r.step_code for r in runs if r.step_code not in self.codes)
        self.runs: dict[RunKey, RunLog] = {}
        for r in kept:
            self.runs.setdefault(run_key(r), r)
        self.commits = sorted({r.commit for r in self.runs.values() if r.commit})
        self.dirty = sum(bool((r.header.get("code") or {}).get("dirty"))
                         for r in self.runs.values())  # fmt: skip

    @classmethod
    def load(cls, out_dir: Path, code: str | None = None) -> RunIndex:
        runs_dir = out_dir / "runs"
        return cls(load_runs(runs_dir), code, load_equivalences(runs_dir))

    def provenance(self) -> str:
        """One paragraph: which code version the tables are made of, and what was left out."""
        if self.code == UNSTAMPED:
            made = (f"**Every table here is made of {len(self.runs)} runs made before runs "
                    "recorded their code**: they span several versions of the library, and "
                    "SCAPE clipped nothing in them. The verdict at one code version is "
                    "still to be run (`make quality-study`, plans in `conf/quality/plan/`).")  # fmt: skip
        else:
            commits = ", ".join(c[:10] for c in self.commits) or "no recorded commit"
            dirty = f"; {self.dirty} from a tree with uncommitted changes" if self.dirty else ""
            made = (f"Every table here is made of the {len(self.runs)} runs of code version "
                    f"`{self.code}` (the library's step and the study's run code, torch and "
                    f"megatron-core versions; commits {commits}{dirty}).")  # fmt: skip
            joined = [r for r in self.equivalences
                      if r["code"] in self.codes and r["same_as"] in self.codes]  # fmt: skip
            if joined:
                made += " " + " ".join(
                    f"Version `{r['code']}` (commit {str(r.get('commit') or '?')[:10]}) "
                    f"replayed {len(r['runs'])} runs of `{r['same_as']}` and got the same "
                    f"bits in every logged record, so their runs share these tables."
                    for r in joined
                )
        if self.left_out:
            other = ", ".join(f"{n} of `{c}`" for c, n in sorted(self.left_out.items()))
            made += f" Left out: runs of other code versions ({other})."
        return made

    def params(self, model: str) -> int | None:
        """The model's parameter count, as its runs recorded it (None when none did)."""
        return next((r.header["params"] for k, r in self.runs.items()
                     if k.model == model and r.header.get("params")), None)  # fmt: skip

    def params_text(self, model: str) -> str:
        n = self.params(model)
        return f"{n / 1e6:.2f}M" if n else "size unknown"

    def final(self, key: RunKey) -> float | None:
        run = self.runs.get(key)
        if run is None:
            return None
        if run.final.get("diverged"):
            return math.inf
        return float(run.final["final_val_loss"])

    def lrs(self, model: str, variant: str, steps: int, seed: int) -> list[float]:
        return sorted(
            k.lr_scale
            for k in self.runs
            if (k.model, k.variant, k.steps, k.seed) == (model, variant, steps, seed)
        )

    def lr_choice(self, model: str, variant: str, steps: int) -> LrChoice | None:
        """The protocol's lr for this cell: lowest mean final loss over all its seeds."""
        finals: dict[float, dict[int, float]] = {}
        for k in self.runs:
            if (k.model, k.variant, k.steps) == (model, variant, steps):
                finals.setdefault(k.lr_scale, {})[k.seed] = self.final(k)  # type: ignore[assignment]
        return choose_lr(finals)

    def best_lr(self, model: str, variant: str, steps: int) -> float | None:
        choice = self.lr_choice(model, variant, steps)
        return None if choice is None else choice.lr

    def seeds(self, model: str, variant: str, steps: int, lr: float) -> list[int]:
        return sorted(
            k.seed
            for k in self.runs
            if (k.model, k.variant, k.steps, k.lr_scale) == (model, variant, steps, lr)
        )

    def paired_gaps(
        self, model: str, variant: str, steps: int, lr: float, ref_lr: float,
        reference: str = REFERENCE,
    ) -> list[float]:  # fmt: skip
        """Percent gap to ``reference`` (dense AdamS; at ``ref_lr``) per seed both have."""
        gaps = []
        for seed in self.seeds(model, variant, steps, lr):
            ref = self.final(RunKey(model, reference, steps, ref_lr, seed))
            val = self.final(RunKey(model, variant, steps, lr, seed))
            if ref is not None and val is not None and math.isfinite(ref):
                gaps.append(100.0 * (val - ref) / ref)
        return gaps


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


def _gap_stats(index: RunIndex, model: str, variant: str, steps: int) -> tuple[float, ...] | None:
    """Mean, min and max over seeds of the paired gap (finite ones), None when none."""
    gaps = [g for g in gap_cell(index, model, variant, steps).gaps if math.isfinite(g)]
    return (statistics.fmean(gaps), min(gaps), max(gaps)) if gaps else None


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


SIZE_FAMILY = "llama"  # the family run at three sizes


def _lr_text(cell: GapCell) -> str:
    return "-" if cell.lr is None else f"{cell.lr:g}" + ("" if cell.closed else ", grid open")


def size_models(index: RunIndex) -> list[str]:
    """The :data:`SIZE_FAMILY` models of the index, smallest first."""
    models = {r.model for r in index.runs.values()
              if r.header.get("family", SIZE_FAMILY) == SIZE_FAMILY}  # fmt: skip
    return sorted(models, key=lambda m: index.params(m) or 0)


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


VERDICT_METHODS = (("SCAPE-90", "scape90", "90%"), ("SCAPE-99", "scape99", "99%"))
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


def scale_text(
    index: RunIndex, labels: dict[str, str], horizons: list[int], paper_sizes: dict[str, int]
) -> str:
    """What the sizes measured here say about the paper's: per SCAPE finalist and horizon
    with two or more sizes, the gap at each size, the fitted slope per 10x parameters with
    its 95% interval, and where that straight line would put the gap at ``paper_sizes``
    (an interval, with what it assumes); every figure from ``index``."""
    sizes = size_models(index)
    shown = ", ".join(f"{m} ({index.params_text(m)})" for m in sizes) or "none"
    lines = []
    for steps in horizons:
        for label, variant, _ in VERDICT_METHODS:
            trend = size_trend(index, variant, steps)
            if trend is None:
                continue
            at = []
            for m in sizes:
                cell = gap_cell(index, m, variant, steps)
                if cell.gaps:
                    open_ = (
                        ""
                        if _closed(index, m, variant, steps)
                        else ", lr grid open: not in the fit"
                    )
                    at.append(f"{_fmt_gap(cell.gaps)} at {index.params_text(m)}{open_}")
            band = trend.slope_interval()
            if band is None:
                verdict = "one point per size, so no interval"
            elif band[0] > 0 or band[1] < 0:
                verdict = ("95% interval [{:+.1f}, {:+.1f}]: the gap {} with size"
                           .format(*band, "grows" if band[0] > 0 else "shrinks"))  # fmt: skip
            else:
                verdict = ("95% interval [{:+.1f}, {:+.1f}]: no trend resolved, the interval "
                           "holds zero".format(*band))  # fmt: skip
            largest = max(p for p, _ in trend.points)
            far = []
            for name, n in paper_sizes.items():
                band_at = trend.interval(n)
                if band_at is not None:
                    far.append(f"{name} ({n / 1e6:,.0f}M, {math.log10(n / largest):.1f} decades "
                               f"past the largest size run): [{band_at[0]:+.0f}, "
                               f"{band_at[1]:+.0f}]%")  # fmt: skip
            lines.append(
                f"- **{labels.get(variant, label)}, {steps:,} steps**: " + "; ".join(at)
                + f". Least squares over the {len(trend.points)} seeds' gaps: "
                f"{trend.slope:+.1f} points per 10x parameters ({verdict})."
                + (" Carried straight in log-parameters, the line's 95% interval at "
                   + "; at ".join(far) + "." if far else "")
            )  # fmt: skip
    if not lines:
        return (f"Sizes of the {SIZE_FAMILY} run at this code version: {shown}. A size trend "
                "needs two sizes with the same method and horizon, each with its lr grid and "
                "dense AdamS's closed; the larger models are queued in "
                "`conf/quality_queue.yaml` (`make quality-queue`).")  # fmt: skip
    return "\n".join([
        f"Sizes of the {SIZE_FAMILY} run at this code version: {shown}; each method at the lr "
        "chosen over its seeds at each size, gaps paired by seed (`gap_vs_steps.png`, last "
        "panel).", "", *lines, "",
        "Those intervals are what a straight line in log-parameters would imply, nothing "
        "more: they assume the trend measured over these sizes holds for every decade beyond "
        "them, at the same horizon and data. The paper trains its models far longer than "
        "these horizons, an axis this fit leaves out (the gap-vs-steps panels show how the "
        "gap moves with training at the sizes run here). Where an interval holds both signs, "
        "the runs here do not say whether SCAPE reaches dense level at the paper's scale.",
    ])  # fmt: skip


def verdict_text(index: RunIndex, models: list[str]) -> str:
    """The verdict in one sentence per sparsity, every figure from ``index``: each SCAPE
    finalist's paired gap to dense AdamS on every model, at the longest horizon where every
    one of their lr grids (dense AdamS's too) is closed on every model, else the longest
    where all were run (its open grids named), with each lr chosen over the seeds there."""
    horizons = sorted({k.steps for k in index.runs}, reverse=True)

    def run(h: int) -> bool:
        return all(gap_cell(index, m, v, h).gaps for m in models for _, v, _ in VERDICT_METHODS)

    def closed(h: int) -> bool:
        return run(h) and all(gap_cell(index, m, v, h).closed for m in models
                              for v in (REFERENCE, *(v for _, v, _ in VERDICT_METHODS)))  # fmt: skip

    # the longest horizon whose every grid is closed; failing that, the longest one run
    steps = next((h for h in horizons if closed(h)), next((h for h in horizons if run(h)), None))
    if steps is None or not models:
        return (
            "No verdict at one code version yet: the finalists (dense AdamS and SCAPE-90/99 "
            "on every model) have not all been run at one horizon. " + index.provenance()
        )
    sentences = []
    for label, variant, sparsity in VERDICT_METHODS:
        parts = []
        for model in models:
            cell = gap_cell(index, model, variant, steps)
            ref = gap_cell(index, model, REFERENCE, steps)
            ahead, n = sum(g < 0 for g in cell.gaps), len(cell.gaps)
            order = ("ahead of dense AdamS in every seed" if ahead == n
                     else "behind dense AdamS in every seed" if ahead == 0
                     else f"ahead of dense AdamS in {ahead} of {n} seeds")  # fmt: skip
            open_ = [name for name, c in ((label, cell), ("AdamS", ref)) if not c.closed]
            grid = f"; lr grid open for {' and '.join(open_)}" if open_ else ""
            against = ""
            to_adamw = gap_cell(index, model, variant, steps, reference=ADAMW)
            if to_adamw.gaps:
                w_ahead, w_n = sum(g < 0 for g in to_adamw.gaps), len(to_adamw.gaps)
                w_order = ("ahead of it in every seed" if w_ahead == w_n
                           else "behind it in every seed" if w_ahead == 0
                           else f"ahead of it in {w_ahead} of {w_n} seeds")  # fmt: skip
                against = f", {_fmt_gap(to_adamw.gaps)} against dense AdamW ({w_order})"
            parts.append(f"{_fmt_gap(cell.gaps)} on {model} ({index.params_text(model)}; "
                         f"{order}{grid}){against}")  # fmt: skip
        sentences.append(f"At {sparsity} sparsity {label} ends " + "; ".join(parts) + ".")
    shown = {REFERENCE, *(v for _, v, _ in VERDICT_METHODS)}
    made = {r.commit for k, r in index.runs.items()
            if k.steps == steps and k.variant in shown and k.model in models and r.commit}  # fmt: skip
    commits = ", ".join(c[:10] for c in sorted(made)) or "an unrecorded commit"
    return (
        " ".join(sentences)
        + f" Gaps in final validation loss to dense AdamS (and to AdamW where named) at "
        f"{steps:,} steps, paired by seed, "
        f"each method at the lr of its lowest mean final loss over the seeds; {clipping(index)}; "
        f"runs of commit {commits} (code version `{index.code}`"
        + (f", with {', '.join(f'`{c}`' for c in sorted(index.codes - {index.code}))}, which "
           "replays showed to compute the same bits" if len(index.codes) > 1 else "")
        + ")."
    )  # fmt: skip


def clip_share(run: RunLog, clip: float) -> tuple[float, float] | None:
    """(share of the run's logged steps whose pre-clip norm exceeded ``clip``, their median
    pre-clip norm); None when it logged no norm. Dense logs its reduced gradient's norm,
    SCAPE its update q's, both before clipping: the share is how often the clip acted."""
    norms = [s["grad_norm"] for s in run.steps
             if isinstance(s.get("grad_norm"), float) and math.isfinite(s["grad_norm"])]  # fmt: skip
    if not norms:
        return None
    return sum(n > clip for n in norms) / len(norms), statistics.median(norms)


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


def policy_clips(index: RunIndex, variants: list[str] | None = None) -> list[float]:
    """The clip norms the runs (of ``variants``, default all) recorded in their settings, a
    variant with its own clip norm (the policy's control arm) excepted."""
    settings = [r.header.get("settings") or {} for k, r in index.runs.items()
                if variants is None or k.variant in variants]  # fmt: skip
    return sorted({s.get("scale", {}).get("clip_grad") for s in settings
                   if s.get("variant", {}).get("clip_grad") is None} - {None})  # fmt: skip


def clipping(index: RunIndex) -> str:
    """The clipping policy the runs used, read from their settings."""
    at = " / ".join(f"{c:g}" for c in policy_clips(index)) or "an unrecorded norm"
    return (f"every arm clips at a global norm of {at} (dense AdamS and AdamW their reduced "
            f"gradient, SCAPE its update q, the norm read off the one synchronized buffer)")  # fmt: skip


VERDICT_FINALISTS = ("adamw", "scape90", "scape99")  # with dense AdamS, the opening table's rows


def finalists_text(
    index: RunIndex, labels: dict[str, str], models: list[str], horizons: list[int]
) -> str:
    """The README's opening tables, every figure from ``index``: the finalists on the small
    models at every horizon; the bf16 wire beside fp32 (where run); the gap against model
    size (where two or more sizes were run)."""
    parts = [
        f"Finalists at one code version (`{index.code}`"
        + "".join(f", with `{c}`" for c in sorted(index.codes - {index.code}))
        + (", joined by bit-for-bit replays (runs/equivalent.json)" if len(index.codes) > 1 else "")
        + "; commits "
        f"{', '.join(c[:10] for c in index.commits) or 'unrecorded'}): final validation loss, "
        f"paired gap to dense AdamS (mean ± sd over seeds) and the lr scale chosen by the "
        f"lowest mean final loss over all seeds at that horizon; {clipping(index)}.",
        "",
        gap_table(index, [REFERENCE, *VERDICT_FINALISTS], labels, models, horizons),
    ]
    to_adamw = gap_table(index, [ADAMW, *(v for _, v, _ in VERDICT_METHODS)], labels, models,
                         horizons, reference=ADAMW)  # fmt: skip
    if to_adamw.count("\n") > 2:  # dense AdamW and a SCAPE finalist ran
        parts += ["", "The same runs against dense AdamW (each at its own lr, paired by seed):",
                  "", to_adamw]  # fmt: skip
    paired = (  # (pairs, the sides' names, the sentence before the table)
        (WIRE_PAIRS, ("fp32 wire", "bf16 wire"), "The bf16 wire at {steps:,} steps, at the fp32 "
         "wire's lr, paired by seed: within the fp32 wire's seed spread in {within} of {n} cells."),
        (CLIP_PAIRS, ("clipped", "unclipped"), "The clip's effect at {steps:,} steps: each "
         "method with no clipping, at its clipped lr, paired by seed; within the clipped runs' "
         "seed spread in {within} of {n} cells."),
    )  # fmt: skip
    for pairs, sides, sentence in paired:
        for steps in horizons:
            rows = paired_rows(index, models, steps, pairs)
            if rows:
                within = sum(r["within"] for r in rows)
                parts += ["", sentence.format(steps=steps, within=within, n=len(rows)), "",
                          paired_table(rows, labels, sides)]  # fmt: skip
    noise = []
    for model in models:
        for steps in horizons:
            choice = index.lr_choice(model, REFERENCE, steps)
            finals = [] if choice is None else [
                index.final(RunKey(model, REFERENCE, steps, choice.lr, s)) for s in choice.seeds]  # fmt: skip
            if len(finals) > 1 and all(math.isfinite(f) for f in finals):  # type: ignore[arg-type]
                noise.append(f"{model} {steps:,}: {_sd(finals):.3f} nats "  # type: ignore[arg-type]
                             f"({100 * _sd(finals) / statistics.fmean(finals):.1f}%)")  # type: ignore[arg-type]  # fmt: skip
    if noise:
        parts += ["", "Seed noise: dense AdamS's final loss varies over seeds (sd, at its chosen "
                  "lr) by " + "; ".join(noise) + ". " + divergence_summary(index)]  # fmt: skip
    clipped = clip_table(index, [REFERENCE, *VERDICT_FINALISTS], labels, models, horizons)
    if clipped:
        parts += ["", "How often the clip acted: the share of logged steps whose "
                  "pre-clip norm exceeded it, mean over seeds, and the median pre-clip norm, "
                  "each method at its chosen lr (dense: the reduced gradient's norm; SCAPE: "
                  "its update q's).", "", clipped]  # fmt: skip
    if len(size_models(index)) >= 2:
        parts += ["", f"Gap against model size ({SIZE_FAMILY}; `gap_vs_steps.png`, last panel):",
                  "", size_table(index, ["scape90", "scape99"], labels, horizons)]  # fmt: skip
    return "\n".join(parts)


RECIPE_MIN_STEPS = 1500  # the shortest horizon whose lr ratio becomes the configs' rule
RECIPE_FAMILY_SIZES = 3  # sizes of a family that must agree for its ratio to be its rule


def model_family(index: RunIndex, model: str) -> str:
    """A model's family (gpt, llama) as its runs recorded it, else read off its name."""
    run = next((r for k, r in index.runs.items() if k.model == model), None)
    family = None if run is None else (run.header.get("family")
                                       or run.header.get("settings", {}).get("model", {}).get("family"))  # fmt: skip
    return family or ("gpt" if model.startswith("gpt") else "llama")


def _mean_gap(
    index: RunIndex, model: str, variant: str, steps: int, multiplier: float
) -> float | None:
    """SCAPE at ``multiplier`` x dense AdamS's chosen lr, paired by seed against AdamS there:
    the mean gap in percent over the seeds both ran (None where SCAPE did not run that lr)."""
    ref = index.best_lr(model, REFERENCE, steps)
    gaps = [] if ref is None else index.paired_gaps(model, variant, steps, multiplier * ref, ref)
    return statistics.fmean(gaps) if gaps else None


def family_rule(index: RunIndex, variant: str, ratios: dict[str, float | None],
                steps: dict[str, int | None]) -> dict[str, Any]:  # fmt: skip
    """One family's multiplier (its models' ``ratios`` at ``steps``, from :func:`recipe`):
    the ratio where at least :data:`RECIPE_FAMILY_SIZES` sizes have one at >=
    :data:`RECIPE_MIN_STEPS` steps and all agree ("sizes agree"); else, among the multipliers
    every such model ran, the one whose worst mean paired gap over the models is least
    ("least worst gap"); None where no model has a closed ratio that long."""
    measured = {m: r for m, r in ratios.items()
                if r is not None and (steps[m] or 0) >= RECIPE_MIN_STEPS}  # fmt: skip
    out: dict[str, Any] = {"multiplier": None, "rule": None, "models": sorted(measured)}
    if len(measured) >= RECIPE_FAMILY_SIZES and len(set(measured.values())) == 1:
        out.update(multiplier=next(iter(measured.values())), rule="sizes agree")
    elif measured:
        candidates = sorted({r * 2.0**i for r in measured.values() for i in range(-3, 4)})
        worst = {}
        for m in candidates:
            gaps = [_mean_gap(index, model, variant, steps[model], m) for model in measured]
            if all(g is not None for g in gaps):
                worst[m] = max(gaps)
        if worst:
            out.update(multiplier=min(worst, key=lambda m: (worst[m], abs(math.log2(m)))),
                       rule="least worst gap")  # fmt: skip
    multiplier = out["multiplier"] or 1.0
    out["gaps"] = {model: {"rule": _mean_gap(index, model, variant, steps[model], multiplier),
                           "x1": _mean_gap(index, model, variant, steps[model], 1.0),
                           "steps": steps[model]}
                   for model in measured}  # fmt: skip
    return out


def recipe(index: RunIndex, models: list[str]) -> dict[str, Any]:
    """SCAPE's lr over dense AdamS's, per SCAPE finalist and per model that ran it (``models``:
    the small ones and every size): the ratio of the chosen lrs at the model's longest
    horizon where both grids are closed (``ratios``, at ``steps``; None where none is);
    ``multiplier`` where every such model has a ratio at >= :data:`RECIPE_MIN_STEPS` and all
    agree; and per model family (``families``) the configs' rule (:func:`family_rule`), which
    conf/optimizer/<variant>.yaml carries as ``lr_multiplier_by_family``. Shorter horizons
    give evidence, never a rule (the best lr moves with the horizon)."""
    out: dict[str, Any] = {"code": index.code, "commits": index.commits,
                           "min_steps": RECIPE_MIN_STEPS, "family_sizes": RECIPE_FAMILY_SIZES,
                           "methods": {}}  # fmt: skip
    horizons = sorted({k.steps for k in index.runs}, reverse=True)
    for _, variant, _ in VERDICT_METHODS:
        ratios: dict[str, float | None] = {}
        steps: dict[str, int | None] = {}
        for model in models:
            if not any((k.model, k.variant) == (model, variant) for k in index.runs):
                continue
            ratios[model] = steps[model] = None
            for h in horizons:
                c, r = index.lr_choice(model, variant, h), index.lr_choice(model, REFERENCE, h)
                if c and r and c.closed and r.closed:
                    ratios[model], steps[model] = c.lr / r.lr, h
                    break
        agree = (bool(ratios) and len(set(ratios.values())) == 1
                 and all(h is not None and h >= RECIPE_MIN_STEPS for h in steps.values()))  # fmt: skip
        families: dict[str, list[str]] = {}
        for model in ratios:
            families.setdefault(model_family(index, model), []).append(model)
        out["methods"][variant] = {
            "multiplier": next(iter(ratios.values())) if agree else None,
            "ratios": ratios, "steps": steps,
            "families": {f: family_rule(index, variant, {m: ratios[m] for m in ms},
                                        {m: steps[m] for m in ms})
                         for f, ms in sorted(families.items())},
        }  # fmt: skip
    return out


def family_multipliers(rec: dict[str, Any], variant: str) -> dict[str, float]:
    """The per-family multipliers the configs carry for ``variant`` (1 where no rule)."""
    families = rec["methods"].get(variant, {}).get("families", {})
    return {f: float(entry["multiplier"] or 1.0) for f, entry in families.items()}


def wire_choice(index: RunIndex, models: list[str]) -> dict[str, Any]:
    """The values' dtype the SCAPE configs ship: bf16 where, at the longest horizon the bf16
    wire was run, it ran beside fp32 for every SCAPE finalist on every model and stayed
    within the fp32 wire's seed spread in every cell; fp32 otherwise (issue 27)."""
    horizons = sorted({k.steps for k in index.runs if k.variant in dict(WIRE_PAIRS).values()})
    for steps in reversed(horizons):
        rows = paired_rows(index, models, steps, WIRE_PAIRS)
        complete = {(r["model"], r["variant"]) for r in rows} == {
            (m, v) for m in models for v, _ in WIRE_PAIRS}  # fmt: skip
        if complete:
            within = sum(r["within"] for r in rows)
            return {"value_dtype": "bfloat16" if within == len(rows) else "float32",
                    "steps": steps, "within": within, "cells": len(rows)}  # fmt: skip
    return {"value_dtype": "float32", "steps": None, "within": 0, "cells": 0}


def recipe_text(rec: dict[str, Any], index: RunIndex, labels: dict[str, str]) -> str:
    """The recipe in a sentence per SCAPE finalist, every figure from ``rec``
    (:func:`recipe`): the rule the configs carry, or the ratios seen and how to tune."""
    lines = []
    for label, variant, _ in VERDICT_METHODS:
        entry = rec["methods"].get(variant)
        if not entry or not entry["ratios"]:
            lines.append(f"- **{label}**: not run at this code version.")
            continue
        seen = "; ".join(
            f"{m} ({index.params_text(m)}): "
            + ("grids not closed at any horizon" if r is None else f"x{r:g} at {h:,} steps")
            for m, r, h in ((m, r, entry["steps"][m]) for m, r in entry["ratios"].items())
        )  # fmt: skip
        if entry["multiplier"] is not None:
            lines.append(f"- **{label}**: lr x{entry['multiplier']:g} dense AdamS's on every "
                         f"model ({seen}); `conf/optimizer/{variant}.yaml` carries it as "
                         "`lr_multiplier`.")  # fmt: skip
            continue
        known = sorted({r for r in entry["ratios"].values() if r is not None})
        tune = (f"sweep `optimizer.lr_multiplier` over x{known[0] / 2:g}-x{known[-1] * 2:g} "
                "(the ratios seen, a factor of 2 either side)" if known else
                "sweep `optimizer.lr_multiplier` in factors of 2 either side of 1")  # fmt: skip
        why = ("the models disagree" if len(known) > 1 else
               f"not yet closed at >= {rec['min_steps']:,} steps on every model")  # fmt: skip
        lines.append(f"- **{label}**: no rule for every model ({why}: {seen}); the config "
                     f"carries one per model family (below). To tune it on your model, {tune}.")  # fmt: skip
    wire = rec.get("wire") or {}
    if wire.get("cells"):
        lines.append(
            f"- **The values on the wire**: `{wire['value_dtype']}`, the SCAPE configs' "
            f"`optimizer.scape.value_dtype`. The bf16 wire stayed within the fp32 wire's seed "
            f"spread in {wire['within']} of {wire['cells']} cells at {wire['steps']:,} steps "
            + ("(every one)." if wire["value_dtype"] == "bfloat16" else
               "(not every one), so the configs send fp32 values."))  # fmt: skip
    elif wire:
        lines.append("- **The values on the wire**: `float32` (the bf16 wire has not been run "
                     "beside it on every model).")  # fmt: skip
    rows = []
    for label, variant, _ in VERDICT_METHODS:
        for family, entry in rec["methods"].get(variant, {}).get("families", {}).items():
            rule = ({"sizes agree": f"{len(entry['models'])} sizes agree",
                     "least worst gap": "least worst gap over the sizes run"}.get(entry["rule"])
                    or f"no closed ratio at >= {rec['min_steps']:,} steps: x1")  # fmt: skip
            for model, g in entry["gaps"].items():
                rows.append(f"| {label} | {family} | x{entry['multiplier'] or 1:g} ({rule}) | "
                            f"{model} ({index.params_text(model)}) | {g['steps']:,} | "
                            f"{_pct(g['rule'])} | {_pct(g['x1'])} |")  # fmt: skip
    if rows:
        lines += ["", "**The configs' rule, per model family** (`lr_multiplier_by_family` in "
                  "`conf/optimizer/scape90.yaml` / `scape99.yaml`, applied by the pretrain "
                  "stage to the model's family and printed at start-up): a family's ratio where "
                  f"{rec.get('family_sizes', RECIPE_FAMILY_SIZES)} or more of its sizes agree, "
                  "else the multiplier whose worst gap over the family's sizes is least. Each "
                  "size's mean paired gap to dense AdamS under the rule and under x1 (SCAPE at "
                  "AdamS's lr; - where not run):", "",
                  "| method | family | rule | model | steps | gap under the rule | gap under x1 |",
                  "| --- | --- | --- | --- | --- | --- | --- |", *rows]  # fmt: skip
    return "\n".join([
        "SCAPE's best lr over dense AdamS's best, each chosen over the seeds, per model at its "
        "longest horizon where both lr grids are closed (`recipe.json`):", "", *lines])  # fmt: skip


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def divergence_summary(index: RunIndex) -> str:
    """What the divergence rule (quality_run.DivergenceRule) found in these runs: every
    count read from them."""
    runs = list(index.runs.items())
    diverged = sorted(f"{k.model} {k.variant} x{k.lr_scale:g} s{k.seed} t{k.steps}"
                      for k, r in runs if r.final.get("diverged"))  # fmt: skip
    spiked = [r for _, r in runs if r.final.get("spike_steps")]
    text = (f"{len(diverged)} of {len(runs)} runs diverged (a non-finite loss, or a training "
            f"loss above log(vocab) + 1 for 20 steps in a row)")  # fmt: skip
    text += f": {', '.join(diverged)}." if diverged else "."
    text += (f" {len(spiked)} had at least one step above that level and recovered"
             if spiked else " No run had a step above that level.")  # fmt: skip
    return text + ("." if spiked else "")


def update_block(path: Path, text: str, name: str = "verdict") -> bool:
    """Replace what stands between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in
    ``path`` with ``text``; False (nothing written) when the file or its markers are absent."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if not path.is_file():
        return False
    doc = path.read_text(encoding="utf-8")
    if begin not in doc or end not in doc:
        return False
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")
    return True


def write_report(
    out_dir: Path,
    variants: dict[str, VariantSpec],
    labels: dict[str, str],
    notes: str,
    *,
    finalists: list[str],
    cost_shape: tuple[str, int, int],
    overview: list[ReadingRow] | None = None,
    verdict_readmes: tuple[Path, ...] = (),
    paper_sizes: dict[str, int] | None = None,
) -> RunIndex:
    """summary.md and gap_vs_steps.png from every finished run under ``out_dir/runs``; the
    verdict (:func:`verdict_text`) into the marked block of ``out_dir/README.md`` and of each
    of ``verdict_readmes`` (the project README, when the report is the committed one); the
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
    (out_dir / "summary.md").write_text("\n".join(text), encoding="utf-8")
    verdict_models = [m for m in models if m in VERDICT_MODELS]
    verdict = verdict_text(index, verdict_models)
    rec = recipe(index, verdict_models + [m for m in size_models(index) if m not in verdict_models])
    rec["wire"] = wire_choice(index, verdict_models)
    (out_dir / "recipe.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    update_block(out_dir / "README.md", recipe_text(rec, index, labels), "recipe")
    for readme in (out_dir / "README.md", *verdict_readmes):
        update_block(readme, verdict)
    update_block(out_dir / "README.md", finalists_text(index, labels, verdict_models, horizons),
                 "finalists")  # fmt: skip
    update_block(out_dir / "README.md", scale, "scale")
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
