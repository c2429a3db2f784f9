"""The report's sentences: the verdict, the finalists' paragraph, the size trend's reading,
the clipping policy and the divergence count, every figure from the runs; and the README
blocks they are written into.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from pipelines.studies.report_stats import (
    ADAMW,
    CLIP_PAIRS,
    CONSTANT_99,
    SIZE_FAMILY,
    VERDICT_FINALISTS,
    VERDICT_METHODS,
    WIRE_PAIRS,
    _closed,
    _fmt_gap,
    _sd,
    gap_cell,
    paired_rows,
    policy_clips,
    size_models,
    size_trend,
)
from pipelines.studies.report_tables import clip_table, gap_table, paired_table, size_table
from pipelines.studies.run_index import REFERENCE, RunIndex, RunKey, RunLog

__all__ = [
    "clipping",
    "divergence_summary",
    "finalists_text",
    "scale_text",
    "update_block",
    "verdict_text",
]


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
        sentences.append(f"At {sparsity} sparsity{ramp_text(index, variant, steps, models)} "
                         f"{label} ends " + "; ".join(parts) + ".")  # fmt: skip
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
        # the joined versions are counted, not listed: each code change adds one, and the
        # README's verdict must stay short (results/quality's provenance names them all)
        + (f", and {len(index.codes) - 1} other version{'' if len(index.codes) == 2 else 's'} that replays showed to compute the "
           "same bits, results/quality/runs/equivalent.json" if len(index.codes) > 1 else "")
        + ")."
    )  # fmt: skip


def clipping(index: RunIndex) -> str:
    """The clipping policy the runs used, read from their settings."""
    at = " / ".join(f"{c:g}" for c in policy_clips(index)) or "an unrecorded norm"
    return (f"every arm clips at a global norm of {at} (dense AdamS and AdamW their reduced "
            f"gradient, SCAPE its update q, the norm read off the one synchronized buffer)")  # fmt: skip


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
                  "", size_table(index, ["scape90", CONSTANT_99, "scape99_ramp"], labels,
                                     horizons)]  # fmt: skip
    return "\n".join(parts)


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


def train_tokens(data_dir: str | Path | None) -> int | None:
    """Tokens of the prepared corpus's training split (its metadata.json), None if unknown."""
    path = Path(data_dir or "") / "metadata.json"
    if not data_dir or not path.is_file():
        return None
    return int(json.loads(path.read_text(encoding="utf-8"))["splits"]["train"]["tokens"])


def length_text(index: RunIndex, labels: dict[str, str], models: list[str],
                tokens: int | None) -> str:  # fmt: skip
    """The gap with training length: per model and SCAPE finalist (and dense AdamW), the paired
    gap to dense AdamS at every horizon run, each method at the lr chosen at that horizon
    ("grid open" where its grid is not closed there: the longest horizons ran one lr), with
    how many passes over the training split each horizon is."""
    horizons = sorted({k.steps for k in index.runs if k.model in models})
    rows = []
    for model in models:
        # the reference's own lr at each horizon: every gap in the model's rows is against it
        choices = [index.lr_choice(model, REFERENCE, steps) for steps in horizons]
        if any(choices):
            rows.append(f"| {model} | dense AdamS (the reference: its lr) | " + " | ".join(
                "-" if c is None else f"x{c.lr:g}" + ("" if c.closed else ", grid open")
                for c in choices) + " |")  # fmt: skip
        for variant in (ADAMW, *(v for _, v, _ in VERDICT_METHODS)):
            cells = []
            for steps in horizons:
                cell = gap_cell(index, model, variant, steps)
                cells.append("-" if not cell.gaps else _fmt_gap(cell.gaps)
                             + ("" if cell.closed else " (grid open)"))  # fmt: skip
            if any(c != "-" for c in cells):
                rows.append(
                    f"| {model} | {labels.get(variant, variant)} | " + " | ".join(cells) + " |"
                )
    if not rows:
        return "No finalist has run on these models at this code version."
    per_step = {}
    for key, run in index.runs.items():
        scale = (run.header.get("settings") or {}).get("scale") or {}
        if all(k in scale for k in ("world_size", "batch_per_worker", "seq_length")):
            per_step.setdefault(key.steps, scale["world_size"] * scale["batch_per_worker"]
                                * scale["seq_length"])  # fmt: skip
    head = [f"{h:,} steps" + (f" ({h * per_step[h] / tokens:.1f} epochs)"
                              if tokens and h in per_step else "") for h in horizons]  # fmt: skip
    corpus = f"the {tokens:,}-token training split" if tokens else "the training split"
    return "\n".join([
        f"Paired gap to dense AdamS by training length, each method at the lr chosen at that "
        f"horizon (epochs: passes over {corpus}; a choice at the edge of the lrs run, one lr "
        "included, says \"grid open\"; each model's first row is dense AdamS's own choice, "
        "which every gap in its rows is measured against). The longest horizon is several "
        "epochs of a small corpus: a gap there "
        "mixes SCAPE's delay with how each method behaves on data it has seen, which a "
        "larger corpus (the GPU-scale runs) would separate.", "",
        "| model | method | " + " | ".join(head) + " |",
        "| --- | --- | " + " | ".join("---" for _ in head) + " |", *rows])  # fmt: skip


# Issue 41's early-gap candidates (variants of the quality study); each is judged at
# EARLY_STEPS against dense AdamS and against the constant SCAPE-99, within EARLY_BUDGET x
# the constant SCAPE-99 run's bytes.
EARLY_CANDIDATES = ("scape99_w7", "scape99_ramp75", "scape99_ramp225", "scape99_ramp")
EARLY_STEPS = 1500
EARLY_BUDGET = 1.5
# Candidates run under the protocol at every horizon (and size): shown against the constant
# SCAPE-99 horizon by horizon.
EARLY_FINALISTS = ("scape99_ramp",)


def _dense_warmup(run: RunLog) -> int:
    options = ((run.header.get("settings") or {}).get("variant") or {}).get("options") or {}
    return int(options.get("dense_warmup_steps", 1))


def _step_bytes(index: RunIndex, model: str, variant: str, steps: int) -> float | None:
    """A sparse step's bytes per rank, as the variant's runs logged them after its warm-up."""
    for key, run in index.runs.items():
        if (key.model, key.variant, key.steps) == (model, variant, steps):
            after = [s["bytes"] for s in run.steps
                     if s.get("step", 0) > _dense_warmup(run) and "bytes" in s]  # fmt: skip
            if after:
                return float(after[0])
    return None


def bytes_vs_constant(index: RunIndex, model: str, variant: str, steps: int) -> float | None:
    """A run of ``variant``'s whole bytes over a constant SCAPE-99 run's (its one dense step
    at dense AdamS's logged bytes, the rest at the constant run's sparse step): a ramp's from
    its final record's ``run_bytes``, a dense warm-up's from its step count; None when a
    side has not run."""
    run = next((r for k, r in index.runs.items()
                if (k.model, k.variant, k.steps) == (model, variant, steps)), None)  # fmt: skip
    dense = _step_bytes(index, model, REFERENCE, steps)
    sparse = _step_bytes(index, model, CONSTANT_99, steps)
    if run is None or dense is None or sparse is None:
        return None
    warm = _dense_warmup(run)
    # a ramp's run logs its whole run's bytes; otherwise dense warm-up, then sparse
    spent = run.final.get("run_bytes")
    if spent is None:
        spent = warm * dense + (steps - warm) * sparse
    return spent / (dense + (steps - 1) * sparse)


def ramp_text(index: RunIndex, variant: str, steps: int, models: list[str]) -> str:
    """How a ramped variant's runs at ``steps`` start and what that costs in bytes, read off
    their headers and records ("" for a variant without a ramp)."""
    runs = [r for k, r in index.runs.items() if (k.variant, k.steps) == (variant, steps)]
    options = [((r.header.get("settings") or {}).get("variant") or {}).get("options") or {}
               for r in runs]  # fmt: skip
    ramped = [o for o in options if o.get("ramp_steps")]
    if not ramped:
        return ""
    share = ramped[0]["ramp_steps"] / steps
    ratios = [x for m in models if (x := bytes_vs_constant(index, m, variant, steps))]
    cost = ("" if not ratios else
            f", x{min(ratios):.2f}" + (f"-{max(ratios):.2f}" if max(ratios) - min(ratios) >= 0.005
                                       else "") + " a constant 99% run's bytes")  # fmt: skip
    return (
        f" (after a density ramp from {ramped[0]['ramp_start_sparsity']:.0%} over the first "
        f"{share:.0%} of steps{cost})"
    )


def early_gap_text(index: RunIndex, labels: dict[str, str], models: list[str]) -> str:
    """The early-gap search within a byte budget: each candidate at :data:`EARLY_STEPS`, its
    whole run's bytes against a constant SCAPE-99 run's (warm-up steps at a dense step's
    bytes, read off the dense AdamS run; the rest at the sparse step's, read off the run),
    its gap to dense AdamS and to the constant SCAPE-99, each at its own chosen lr."""
    steps, rows = EARLY_STEPS, []
    for model in models:
        base = gap_cell(index, model, CONSTANT_99, steps)
        for variant in EARLY_CANDIDATES:
            cell = gap_cell(index, model, variant, steps)
            if not cell.gaps:
                continue
            spent = bytes_vs_constant(index, model, variant, steps)
            ratio = "-" if spent is None else f"x{spent:.2f}"
            vs = gap_cell(index, model, variant, steps, reference=CONSTANT_99)
            rows.append(f"| {model} | {labels.get(variant, variant)} | {ratio} | "
                        f"{cell.lr:g}{'' if cell.closed else ' (grid open)'} | {_fmt_gap(cell.gaps)} | "
                        f"{_fmt_gap(base.gaps)} | {_fmt_gap(vs.gaps)} |")  # fmt: skip
    if not rows:
        return (f"No early-gap candidate has run at {steps:,} steps at this code version "
                "(`make quality-queue ARGS=\"'only=[early_gap_w7_1500,early_gap_ramp_1500]'\"`).")  # fmt: skip
    table = "\n".join([
        f"Candidates for SCAPE-99's early gap at {steps:,} steps whose whole run sends at most "
        f"{EARLY_BUDGET:g}x a constant SCAPE-99 run's bytes (its one dense step counted; a dense "
        "step's bytes read off the dense AdamS run, a sparse step's off the candidate's), each at "
        "the lr chosen over its seeds, gaps paired by seed:", "",
        "| model | candidate | bytes vs constant SCAPE-99 | lr x | gap to dense AdamS | constant "
        "SCAPE-99's gap | candidate vs constant SCAPE-99 |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows])  # fmt: skip
    return "\n\n".join([table, *_by_horizon(index, labels, models)])


def _by_horizon(index: RunIndex, labels: dict[str, str], models: list[str]) -> list[str]:
    """Each :data:`EARLY_FINALISTS` candidate against the constant SCAPE-99, every horizon
    (and every size of the size family) where both ran, each at its own chosen lr."""
    sized = [m for m in size_models(index) if m not in models]
    out = []
    for variant in EARLY_FINALISTS:
        horizons = sorted({k.steps for k in index.runs if k.variant == variant})
        rows = []
        for model in [*models, *sized]:
            cells = []
            for steps in horizons:
                vs = gap_cell(index, model, variant, steps, reference=CONSTANT_99)
                own = gap_cell(index, model, variant, steps)
                cells.append("-" if not vs.gaps else
                             f"{_fmt_gap(vs.gaps)} (lr x{own.lr:g}{'' if own.closed else ', grid open'})")  # fmt: skip
            if any(c != "-" for c in cells):
                params = index.params(model)
                name = f"{model} ({params / 1e6:.2f}M)" if params else model
                rows.append(f"| {name} | " + " | ".join(cells) + " |")
        if rows:
            out.append("\n".join([
                f"{labels.get(variant, variant)} against the constant SCAPE-99 by training "
                "length (each at the lr chosen over its seeds, paired by seed; its gap to dense "
                "AdamS: summary.md's finalists table and gap_vs_steps.png):", "",
                "| model | " + " | ".join(f"{h:,} steps" for h in horizons) + " |",
                "| --- | " + " | ".join("---" for _ in horizons) + " |", *rows]))  # fmt: skip
    return out
