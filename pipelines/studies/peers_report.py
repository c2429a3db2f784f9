"""The peers study's report: the loss-for-bytes frontier of every method at its chosen lr,
and the curves behind it, written from finished pretrain runs.

- ``frontier.json``: per method, the lr chosen over the seeds
  (:func:`pipelines.studies.protocol.choose_lr`; "grid open" where the best lr is at the grid's
  edge), the final validation loss, the gap to dense AdamS paired by seed, the bytes per rank
  per step counted at the collectives (run mean) and by formula at the run's shape and projected to the paper's
  shapes (:mod:`pipelines.studies.peers_bytes`); the setting, the unigram level of the
  training split, and the code version and commits the runs came from. Every figure of
  ``frontier.md``, ``frontier.png`` and the README block is read from it.
- ``peers.md``, ``peers.csv``, ``peers.json``, ``loss_vs_bytes.png``: the chosen-lr runs'
  seed statistics and loss against cumulative bytes; step times from the emulated-cluster
  files of ``make bench-peers-cluster`` (:mod:`benchmarks.peers_cluster`) where present,
  else "not measured".
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.studies.peers_figures import plot_frontier, plot_loss_vs_bytes
from pipelines.studies.protocol import LrChoice, choose_lr
from pipelines.training.config import PretrainConfig
from pipelines.training.metrics import sent_total
from pipelines.training.provenance import PROVENANCE_FILE
from pipelines.training.tracking import METRICS_FILE, read_metrics

__all__ = [
    "REFERENCE",
    "MethodResult",
    "StudyRun",
    "final_val_loss",
    "frontier",
    "frontier_block",
    "frontier_table",
    "lr_choices",
    "report",
    "summarize_method",
]

REFERENCE = "adams"
SUMMARY_FILE = "summary.json"
BLOCK = "frontier"  # <!-- frontier:begin --> ... <!-- frontier:end --> in the README


@dataclass(frozen=True)
class StudyRun:
    """One pretrain run of the study: ``method`` at ``lr_scale`` times its config's lr."""

    method: str
    label: str
    lr_scale: float
    seed: int
    run_dir: Path
    cfg: PretrainConfig = field(compare=False, repr=False)


def _summary(run: StudyRun) -> dict[str, Any] | None:
    """The run's own summary.json (None before it wrote one)."""
    path = run.run_dir / SUMMARY_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _trained_lr(run: StudyRun) -> float:
    """The peak lr the run trained at, read off its own recorded config (the configs it is
    planned from may have moved since: a recipe's new multiplier), else the planned one."""
    optimizer = (_summary(run) or {}).get("config", {}).get("optimizer", {})
    if "lr" in optimizer and optimizer.get("lr_multiplier") is not None:
        return optimizer["lr"] * optimizer["lr_multiplier"]
    return run.cfg.optimizer.scaled()["lr"]


def final_val_loss(run: StudyRun) -> float | None:
    """The run's final validation loss once it finished every step (``math.inf`` when it
    diverged: a NaN loss); None while it has not."""
    summary = _summary(run)
    if summary is None:
        return None
    if summary.get("status") != "finished" or summary.get("step") != run.cfg.train.train_steps:
        return None
    loss = summary.get("final_val_loss")
    return float(loss) if loss is not None and math.isfinite(float(loss)) else math.inf


def lr_choices(runs: list[StudyRun]) -> dict[str, LrChoice | None]:
    """Per method, the lr scale of the lowest mean final loss over the seeds, from the
    finished runs (None while no lr has finished on every seed the method ran)."""
    finals: dict[str, dict[float, dict[int, float]]] = {}
    for run in runs:
        loss = final_val_loss(run)
        cell = finals.setdefault(run.method, {})
        if loss is not None:
            cell.setdefault(run.lr_scale, {})[run.seed] = loss
    return {m: choose_lr(cell) for m, cell in finals.items()}


@dataclass
class MethodResult:
    method: str
    label: str
    seeds: int
    final_val_loss: float
    final_val_loss_std: float
    bytes_per_step: float  # per rank, mean over the run (warm-up phases included)
    curve: list[tuple[float, float]]  # (cumulative bytes per rank, seed-mean val loss)
    eval_steps: list[int]
    diverged: int = 0  # seeds whose final validation loss is not finite (left out of the means)
    step_time_s: dict[str, float] = field(default_factory=dict)  # link -> median step time
    time_to_target_s: dict[str, float] = field(default_factory=dict)  # link -> seconds
    steps_to_target: int | None = None


def summarize_method(method: str, label: str, runs: list[list[dict[str, Any]]]) -> MethodResult:
    """Seed statistics of one method from its runs' metrics records."""
    finals, per_step, curves, diverged = [], [], [], 0
    for records in runs:
        totals = [sent_total(r) for r in records]
        per_step.append(sum(totals) / len(totals))
        final = next(r["val_loss"] for r in reversed(records) if "val_loss" in r)
        if not math.isfinite(final):
            diverged += 1
            continue
        finals.append(final)
        cumulative, curve = 0.0, {}
        for r, sent in zip(records, totals, strict=True):
            cumulative += sent
            if "val_loss" in r:
                curve[int(r["step"])] = (cumulative, float(r["val_loss"]))
        curves.append(curve)
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    mean_curve = [
        (statistics.fmean(c[s][0] for c in curves), statistics.fmean(c[s][1] for c in curves))
        for s in steps
    ]
    return MethodResult(
        method=method,
        label=label,
        seeds=len(runs),
        final_val_loss=statistics.fmean(finals) if finals else math.nan,
        final_val_loss_std=statistics.stdev(finals) if len(finals) > 1 else 0.0,
        bytes_per_step=statistics.fmean(per_step),
        curve=mean_curve,
        eval_steps=steps,
        diverged=diverged,
    )


def _link(cluster: dict[str, Any]) -> str:
    return cluster.get("link", {}).get("label") or "emulated cluster"


def _attach_times(results: list[MethodResult], clusters: list[dict[str, Any]]) -> None:
    """Steps to reach dense AdamS's final loss (seed means), and that time on each cluster."""
    target = next(r for r in results if r.method == REFERENCE).final_val_loss
    for r in results:
        reached = [s for s, (_, loss) in zip(r.eval_steps, r.curve, strict=True) if loss <= target]
        r.steps_to_target = reached[0] if reached else None
        for cluster in clusters:
            step_time = cluster.get("methods", {}).get(r.method, {}).get("step_time_s")
            if step_time is None:
                continue
            r.step_time_s[_link(cluster)] = step_time
            if r.steps_to_target is not None:
                r.time_to_target_s[_link(cluster)] = r.steps_to_target * step_time


def _table(results: list[MethodResult], links: list[str]) -> str:
    ref = next(r for r in results if r.method == REFERENCE)
    links = links or ["emulated cluster"]
    head = (
        "| method | final val loss (mean ± sd, n) | vs AdamS | kB/rank/step | AdamS bytes / this |"
        + "".join(f" step time, {link} (ms) |" for link in links)
        + " steps to AdamS's loss |"
        + "".join(f" time to AdamS's loss, {link} (s) |" for link in links)
    )
    lines = [head, "|" + "---|" * (6 + 2 * len(links))]
    for r in results:
        gap = 100.0 * (r.final_val_loss / ref.final_val_loss - 1.0)
        gap_text = f"{gap:+.2f}%" if math.isfinite(gap) else "-"
        step_ms = [
            f"{1000 * r.step_time_s[k]:.0f}" if k in r.step_time_s else "not measured"
            for k in links
        ]
        steps = str(r.steps_to_target) if r.steps_to_target is not None else "never"
        tt = [
            f"{r.time_to_target_s[k]:.1f}"
            if k in r.time_to_target_s
            else ("never" if r.steps_to_target is None else "not measured")
            for k in links
        ]
        loss = f"{r.final_val_loss:.3f} ± {r.final_val_loss_std:.3f} ({r.seeds - r.diverged})"
        if r.diverged:
            loss = f"diverged in {r.diverged} of {r.seeds} seeds" + (
                f"; others {loss}" if r.diverged < r.seeds else ""
            )
        lines.append(
            f"| {r.label} | {loss} "
            f"| {gap_text} | {r.bytes_per_step / 1e3:,.1f} "
            f"| {ref.bytes_per_step / r.bytes_per_step:.1f} | {' | '.join(step_ms)} | {steps} "
            f"| {' | '.join(tt)} |"
        )
    return "\n".join(lines)


def _stats(values: list[float]) -> dict[str, float | int]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    return {
        "n": len(finite),
        "mean": statistics.fmean(finite),
        "sd": statistics.stdev(finite) if len(finite) > 1 else 0.0,
        "min": min(finite),
        "max": max(finite),
    }


def _commit(run: StudyRun) -> dict[str, Any]:
    path = run.run_dir / PROVENANCE_FILE
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {"commit": record.get("commit"), "dirty": bool(record.get("dirty")),
            "resumed": record.get("resumed", [])}  # fmt: skip


def frontier(
    runs: list[StudyRun],
    *,
    code: dict[str, Any],
    setting: dict[str, Any],
    unigram: dict[str, Any],
    projections: dict[str, dict[str, float]],
    formula_here: dict[str, float],
    command: str,
) -> dict[str, Any]:
    """The frontier's JSON: per method at its chosen lr, seed statistics of the final loss,
    the gap to dense AdamS paired by seed, and the bytes. ``projections[method][shape name]``
    and ``formula_here[method]`` are the steady-state byte formulas (the caller's, from
    :mod:`pipelines.studies.peers_bytes`); ``code`` names the code version the runs share."""
    choices = lr_choices(runs)
    chosen = {m: c for m, c in choices.items() if c is not None}
    picked = {(r.method, r.seed): r for r in runs if r.method in chosen
              and r.lr_scale == chosen[r.method].lr and r.seed in chosen[r.method].seeds}  # fmt: skip
    ref = chosen.get(REFERENCE)
    ref_loss = {s: final_val_loss(picked[(REFERENCE, s)]) for s in ref.seeds} if ref else {}
    methods, commits = [], {}
    for method in dict.fromkeys(r.method for r in runs):
        choice = chosen.get(method)
        mine = [picked[(method, s)] for s in choice.seeds] if choice else []
        finals = {r.seed: final_val_loss(r) for r in mine}
        gaps = {
            s: 100.0 * (loss / ref_loss[s] - 1.0)
            for s, loss in finals.items()
            if s in ref_loss and math.isfinite(loss) and math.isfinite(ref_loss[s])
        }
        records = [read_metrics(r.run_dir / METRICS_FILE) for r in mine]
        per_step = [[sent_total(x) for x in recs if "bytes" in x] for recs in records]
        for r in mine:
            c = _commit(r)
            commits.setdefault((c["commit"], c["dirty"]), []).append(r.run_dir.name)
        label = next(r.label for r in runs if r.method == method)
        methods.append({
            "method": method, "label": label,
            "lr_scale": choice.lr if choice else None,
            "lr": _trained_lr(mine[0]) if choice else None,  # scale included
            "closed": bool(choice and choice.closed),
            "grid": list(choice.grid) if choice else sorted({r.lr_scale for r in runs if r.method == method}),
            "seeds": list(choice.seeds) if choice else [],
            "final": {**_stats(list(finals.values())),
                      "diverged": sum(not math.isfinite(v) for v in finals.values()),
                      "per_seed": {str(s): v for s, v in finals.items()}},
            "gap_pct": {**_stats(list(gaps.values())), "per_seed": {str(s): g for s, g in gaps.items()}},
            "bytes": {
                "measured_mean": statistics.fmean(statistics.fmean(b) for b in per_step) if mine else math.nan,
                "measured_last": statistics.fmean(b[-1] for b in per_step) if mine else math.nan,
                "formula_here": formula_here.get(method, math.nan),
                "projected": projections.get(method, {}),
            },
            "runs": [r.run_dir.name for r in mine],
            "unfinished": sum(final_val_loss(r) is None for r in runs if r.method == method),
        })  # fmt: skip
    code = {**code, "commits": [{"commit": c, "dirty": d, "runs": len(names)}
                                for (c, d), names in commits.items()]}  # fmt: skip
    return {"command": command, "reference": REFERENCE, "code": code, "setting": setting,
            "unigram": unigram, "methods": methods}  # fmt: skip


def _num(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}" if isinstance(x, int | float) and math.isfinite(x) else "-"


def _bytes_text(nbytes: float) -> str:
    if not (isinstance(nbytes, int | float) and math.isfinite(nbytes)):
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,.0f} B"


def frontier_table(doc: dict[str, Any]) -> str:
    """The frontier as a markdown table (every figure from ``doc``, :func:`frontier`'s JSON)."""
    shapes = [p["name"] for p in doc["setting"]["paper_shapes"]]
    world = doc["setting"]["paper_shapes"][0]["world_size"] if shapes else 0
    head = ("| method | lr (x base) | final val loss (mean ± sd, n) | gap to AdamS (mean ± sd; min to max) "
            "| bytes/rank/step, counted | " + " | ".join(f"{s} at {world} ranks" for s in shapes) + " |")  # fmt: skip
    lines = [head, "|" + "---|" * (5 + len(shapes))]
    for m in doc["methods"]:
        f, g, b = m["final"], m["gap_pct"], m["bytes"]
        if m["lr_scale"] is None:
            lr = "no lr finished on every seed"
        else:
            lr = f"x{m['lr_scale']:g}" + ("" if m["closed"] else " (grid open)")
        loss = f"{_num(f['mean'], 3)} ± {_num(f['sd'], 3)} ({f['n']})"
        if f["diverged"]:
            loss += f"; diverged in {f['diverged']} of {len(m['seeds'])}"
        gap = "reference" if m["method"] == doc["reference"] else (
            f"{g['mean']:+.2f}% ± {g['sd']:.2f} ({g['min']:+.2f} to {g['max']:+.2f})"
            if g["n"] else "-")  # fmt: skip
        proj = [_bytes_text(b["projected"].get(s, math.nan)) for s in shapes]
        lines.append(f"| {m['label']} | {lr} | {loss} | {gap} | {_bytes_text(b['measured_mean'])} | "
                     + " | ".join(proj) + " |")  # fmt: skip
    return "\n".join(lines)


def _status(doc: dict[str, Any]) -> str:
    s = doc["setting"]
    want = len(s["seeds"])
    short = [m["label"] for m in doc["methods"] if m["final"]["n"] + m["final"]["diverged"] < want]
    open_ = [m["label"] for m in doc["methods"] if m["lr_scale"] is not None and not m["closed"]]
    unfinished = sum(m.get("unfinished", 0) for m in doc["methods"])
    if not short and not open_ and not unfinished:
        return (
            f"Complete: every method has {want} seeds at its chosen lr, and every grid is closed."
        )
    parts = [f"{unfinished} planned runs not finished"] if unfinished else []
    if short:
        parts.append(f"fewer than {want} seeds at the chosen lr: {', '.join(short)}")
    if open_:
        parts.append(f"grid open: {', '.join(open_)}")
    return "Incomplete (" + "; ".join(parts) + "): rerun `make peers-study` to finish it."


def frontier_caption(doc: dict[str, Any]) -> str:
    """What the table and figure show and how they were made, from ``doc`` alone."""
    s, u, code = doc["setting"], doc["unigram"], doc["code"]
    ref = next((m for m in doc["methods"] if m["method"] == doc["reference"]), None)
    below = ""
    if ref and ref["final"]["n"]:
        margin = u["nats"] - ref["final"]["mean"]
        where = "below" if margin > 0 else "above"
        below = (f" Dense AdamS ends {abs(margin):.2f} nats {where} it "
                 f"({ref['final']['mean']:.3f}).")  # fmt: skip
    shapes = ", ".join(
        f"{p['name']} ({p['params'] / 1e6:,.0f}M parameters)" for p in s["paper_shapes"]
    )
    world = s["paper_shapes"][0]["world_size"] if s["paper_shapes"] else 0
    commits = ", ".join(
        f"{(c['commit'] or 'unknown')[:10]}{' (uncommitted changes)' if c['dirty'] else ''}: {c['runs']} runs"
        for c in code["commits"]
    )  # fmt: skip
    others = code.get("other_versions") or {}
    left_out = (" Left out, as runs of other code: " + ", ".join(
        f"`{v}` ({n} runs)" for v, n in others.items()) + ".") if others else ""  # fmt: skip
    return (
        f"Final validation loss after {s['steps']:,} steps of the {s['model']} "
        f"({s['params']:,} parameters, {s['vocab']:,}-entry {s['tokenizer']} vocabulary, data "
        f"`{s['data']}`; {s['ranks']} ranks, {s['tokens_per_step']:,} tokens per step; lr "
        f"{s['lr']:g} x the scale shown, cosine to a tenth, {s['warmup_steps']} warm-up steps), "
        f"seeds {', '.join(str(x) for x in s['seeds'])}. Each method at the lr scale of its lowest "
        f"mean final loss over the seeds (grid {', '.join(f'x{x:g}' for x in s['lr_scales'])}, "
        f'extended x0.5 / x2 on every seed while the best is at an edge; "grid open" where it '
        f"still is). Gap: per seed against dense AdamS at its own chosen lr, then mean ± sd and "
        f"min to max over the seeds. Unigram level (entropy of the training split's token "
        f"frequencies, {u['tokens']:,} tokens): {u['nats']:.3f} nats/token.{below} Bytes per "
        f"rank per step: counted, the mean over the run (warm-up phases included) of what each "
        f"method's collectives were handed (their tensors' sizes, ring accounting, booked by the "
        f"run's own counters at each call; not a capture of the wire); projected, "
        f"the steady-state formula of each method (pipelines/studies/peers_bytes.py, fp32 "
        f"values) at {shapes} on {world} ranks. Runs of code version `{code['version']}`; "
        f"commits {commits}.{left_out} {_status(doc)}"
    )


def frontier_block(doc: dict[str, Any]) -> str:
    """The README's generated block: the figure, the table and its caption."""
    return (f"![gap to dense AdamS against bytes per rank per step](frontier.png)\n\n"
            f"{frontier_table(doc)}\n\n{frontier_caption(doc)}")  # fmt: skip


def report(
    runs: list[StudyRun],
    out_dir: Path,
    cluster_jsons: list[Path],
    command: str,
    *,
    code: dict[str, Any],
    setting: dict[str, Any],
    unigram: dict[str, Any],
    projections: dict[str, dict[str, float]],
    formula_here: dict[str, float],
    readme: Path | None = None,
) -> dict[str, Any]:
    """Write the frontier (JSON, table, figure; the README's block when ``readme`` has its
    markers) and the chosen-lr curves (peers.md/csv/json, loss_vs_bytes.png) for the finished
    runs of ``runs``; returns the frontier's JSON."""
    doc = frontier(runs, code=code, setting=setting, unigram=unigram, projections=projections,
                   formula_here=formula_here, command=command)  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "frontier.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (out_dir / "frontier.md").write_text(
        f"{frontier_table(doc)}\n\n{frontier_caption(doc)}\n", encoding="utf-8"
    )
    plot_frontier(doc, out_dir / "frontier.png")
    ref = next((m for m in doc["methods"] if m["method"] == REFERENCE), None)
    if readme is not None and ref is not None and ref["final"]["n"]:  # nothing to show before
        from pipelines.studies.report_prose import update_block

        update_block(readme, frontier_block(doc), BLOCK)
    _curves(runs, doc, out_dir, cluster_jsons, command)
    return doc


def rewrite_frontier(out_dir: Path, readme: Path | None = None) -> dict[str, Any]:
    """frontier.md, frontier.png and the README's block again from the committed
    ``frontier.json`` alone (a wording or plotting change needs no run)."""
    doc = json.loads((out_dir / "frontier.json").read_text(encoding="utf-8"))
    (out_dir / "frontier.md").write_text(
        f"{frontier_table(doc)}\n\n{frontier_caption(doc)}\n", encoding="utf-8"
    )
    plot_frontier(doc, out_dir / "frontier.png")
    if readme is not None:
        from pipelines.studies.report_prose import update_block

        update_block(readme, frontier_block(doc), BLOCK)
    return doc


if __name__ == "__main__":  # python -m pipelines.studies.peers_report results/peers
    import sys

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "results/peers")
    rewrite_frontier(folder, folder / "README.md")
    print(f"rewrote {folder}/frontier.md, frontier.png and README.md's block from frontier.json")


def _curves(
    runs: list[StudyRun],
    doc: dict[str, Any],
    out_dir: Path,
    cluster_jsons: list[Path],
    command: str,
) -> list[MethodResult]:
    """peers.md/csv/json and loss_vs_bytes.png over each method's chosen-lr runs."""
    names = {m["method"]: set(m["runs"]) for m in doc["methods"]}
    results = []
    for m in doc["methods"]:
        mine = [r for r in runs if r.method == m["method"] and r.run_dir.name in names[m["method"]]]
        if mine:
            records = [read_metrics(r.run_dir / METRICS_FILE) for r in mine]
            results.append(summarize_method(m["method"], m["label"], records))
    if not any(r.method == REFERENCE for r in results):
        return results
    clusters = [json.loads(p.read_text()) for p in cluster_jsons if p.is_file()]
    _attach_times(results, clusters)
    table = _table(results, [_link(c) for c in clusters])
    (out_dir / "peers.md").write_text(table + "\n")
    (out_dir / "peers.json").write_text(
        json.dumps({"command": command, "results": [vars(r) for r in results]}, indent=1)
    )
    with open(out_dir / "peers.csv", "w") as f:
        f.write("method,label,seeds,diverged,final_val_loss,sd,bytes_per_step,steps_to_target,step_time_s,time_to_target_s\n")  # fmt: skip
        for r in results:
            f.write(
                f"{r.method},{r.label},{r.seeds},{r.diverged},{r.final_val_loss:.5f},"
                f"{r.final_val_loss_std:.5f},{r.bytes_per_step:.0f},{r.steps_to_target or ''},"
                f'"{json.dumps(r.step_time_s)}","{json.dumps(r.time_to_target_s)}"\n'
            )
    plot_loss_vs_bytes([(r.label, r.curve) for r in results], out_dir / "loss_vs_bytes.png")
    return results
