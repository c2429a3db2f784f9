"""Hydra stage: collect finished runs into the paper's tables and loss-curve figures.

    python -m pipelines.tables                      # every experiment under runs/
    python -m pipelines.tables output_root=runs experiments=[gpt345m_owt_quality]

    python -m pipelines.tables wandb_report=true    # + one W&B report per experiment

Writes ``<out_dir>/quality.{md,csv,tex}``, ``<out_dir>/efficiency.{md,csv,tex}`` and
``<out_dir>/loss_<experiment>.png``; with ``wandb_report=true`` also each experiment's W&B
report, saved to W&B when ``WANDB_API_KEY`` is set, else written as
``<out_dir>/wandb_report_<experiment>.json`` for ``python -m pipelines.wandb_report publish``
(``pipelines/wandb_report.py``).

Quality: final validation loss / perplexity (the evaluate stage's, over the validation split or
the evenly spaced windows it was capped to; training's periodic estimate when a run has not been
evaluated), its distance to the
corpus's unigram level (``eval.unigram``, stated in the notes), and downstream accuracy per
optimizer; an accuracy within noise of its task's chance rate is marked "at chance".
Efficiency (``pipelines.efficiency``): bytes per rank per step from the runs, no speed
columns (the runs' own step times are loopback CPU times, not a speed measure; speed is
``make bench-step``'s, results/bench/README.md). The paper's published headline figures
(the abstract's; no table values are public) sit in their own column.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from data_prep.dataset import prepared_dir
from pipelines.efficiency import efficiency_table
from pipelines.stage import one_line_errors, register_schema
from pipelines.training.config import sparsity_of
from pipelines.training.metrics import sent_by_kind, sent_total
from pipelines.training.provenance import PROVENANCE_FILE, git_version
from pipelines.training.tracking import METRICS_FILE, read_metrics

__all__ = [
    "CHANCE",
    "PAPER_CLAIMS",
    "TablesConfig",
    "at_chance",
    "chance_of",
    "collect_runs",
    "run",
]

# The abstract's figures per experiment, printed in a line of their own under the tables
# (never as a column beside our rows: they are the paper's claims, not measurements here).
PAPER_CLAIMS = {
    "gpt345m_owt_quality": "SCAPE-90/99 preserve validation loss and downstream accuracy",
    "llama500m_slimpj_quality": "quality comparable to dense, up to 43.3% less end-to-end time",
    "llama500m_wallclock": "up to 43.3% less end-to-end time",
    "llama1p8b_step": "up to 3.26x faster steps than dense AdamS",
}
MANIFEST_FILE = "manifest.json"
BASELINE = "AdamS"
ORDER = ["AdamW", "AdamS", "SCAPE-90", "SCAPE-99"]


@dataclass
class TablesConfig:
    output_root: str = "runs"
    experiments: list[str] = field(default_factory=list)  # empty: all found
    out_dir: str = "results/tables"
    skip_steps: int = 2  # steps left out of the byte medians (start-up, dense warm-up)
    # one W&B report per experiment (wandb-workspaces): saved when WANDB_API_KEY is set,
    # else written as <out_dir>/wandb_report_<experiment>.json
    wandb_report: bool = False
    # an accuracy is "at chance" within this many binomial standard errors of chance
    chance_sigmas: float = 2.0


@dataclass
class RunSummary:
    experiment: str
    name: str
    label: str
    model: str
    sparsity: float
    metrics: list[dict[str, Any]]
    eval: dict[str, Any]
    wandb_project: str = "scape-repro"
    wandb_entity: str | None = None
    prepared: Path | None = None  # the prepared data the run trained on
    run_dir: Path | None = None
    provenance: dict[str, Any] = field(default_factory=dict)  # the code that made it
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def final_val_loss(self) -> float | None:
        """The evaluate stage's loss over the validation split (or its capped windows), else
        training's last estimate."""
        full = (self.eval.get("validation") or {}).get("loss")
        if full is not None:
            return float(full)
        vals = [r["val_loss"] for r in self.metrics if "val_loss" in r]
        return vals[-1] if vals else None

    def step_times(self, skip: int) -> list[float]:
        return [r["step_time"] for r in self.metrics if r["step"] > skip]

    def train_seconds(self) -> float:
        return float(sum(r["step_time"] for r in self.metrics))

    def bytes_per_step(self, skip: int) -> dict[str, float]:
        rows = [sent_by_kind(r) for r in self.metrics if r["step"] > skip]
        kinds = sorted({k for row in rows for k in row})
        return {k: statistics.median(row.get(k, 0.0) for row in rows) for k in kinds}

    def run_bytes_per_step(self) -> float:
        """Every kind's bytes summed, the mean over all of the run's steps: what a run sends
        per step in all, warm-up and density ramp included."""
        totals = [sent_total(r) for r in self.metrics]
        return statistics.fmean(totals) if totals else 0.0


def collect_runs(root: Path, experiments: list[str]) -> list[RunSummary]:
    """Every run directory with a config and metrics; unfinished runs are included as they stand."""
    runs = []
    for config_path in sorted(root.glob("*/*/config.yaml")):
        run_dir = config_path.parent
        experiment = run_dir.parent.name
        if experiments and experiment not in experiments:
            continue
        metrics = read_metrics(run_dir / METRICS_FILE)
        if not metrics:
            continue
        cfg = OmegaConf.load(config_path)
        eval_path = run_dir / "eval" / "results.json"
        evaluation = json.loads(eval_path.read_text()) if eval_path.is_file() else {}
        provenance = run_dir / PROVENANCE_FILE
        sparsity = sparsity_of(cfg.optimizer)
        runs.append(
            RunSummary(
                experiment,
                run_dir.name,
                str(cfg.optimizer.label),
                str(cfg.model.name),
                sparsity,
                metrics,
                evaluation,
                str(cfg.wandb.project),
                cfg.wandb.entity,
                prepared_dir(cfg.data_root, cfg.data.name, cfg.tokenizer.name),
                run_dir,
                json.loads(provenance.read_text()) if provenance.is_file() else {},
                OmegaConf.to_container(cfg, resolve=False),  # type: ignore[arg-type]
            )
        )
    return sorted(
        runs,
        key=lambda r: (r.experiment, ORDER.index(r.label) if r.label in ORDER else 99, r.label),
    )


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}f}"
    return str(value)


# The headline metric(s) of a task; perplexities of near-random tiny models only add noise.
TABLE_METRICS = ("acc", "acc_norm", "bits_per_byte")
ACCURACIES = ("acc", "acc_norm")

# What guessing scores on each task, where the run's evaluation did not measure it: 1 / the
# number of choices for multiple choice (ARC items have 3-5 choices, almost all 4). The
# local tasks' rates are measured on their own items by the evaluate stage (the manifest's
# "chance", eval.build_tasks.chance_rate): a last-word cloze is not at 0, since always
# answering its most frequent word is sometimes right. LAMBADA has no such measure here.
CHANCE = {
    "scape_nextsent": 0.25,
    "hellaswag": 0.25,
    "arc_easy": 0.25,
    "arc_challenge": 0.25,
    "piqa": 0.5,
    "winogrande": 0.5,
}


def chance_of(task: str, evaluation: dict[str, Any]) -> float | None:
    """The task's chance rate: measured by the evaluation when it recorded one, else
    :data:`CHANCE`'s; None when neither knows it."""
    measured = ((evaluation.get("local_tasks") or {}).get("tasks") or {}).get(task) or {}
    return measured.get("chance", CHANCE.get(task))


def at_chance(
    accuracy: float, chance: float | None, examples: int | None, sigmas: float
) -> bool | None:
    """Is an accuracy no better than the task's chance rate c, within noise? None when c or
    n is unknown.

    Noise is the binomial standard error of a guesser over the task's n items,
    sqrt(c (1 - c) / n), but at least that of one item (1 / n), so a rate measured near 0
    still leaves room for a lucky answer: at chance when accuracy <= c + sigmas x that (an
    accuracy below chance is no result either).
    """
    if chance is None or not examples:
        return None
    noise = max(math.sqrt(chance * (1 - chance) / examples), 1.0 / examples)
    return accuracy <= chance + sigmas * noise


def _task_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    """Flatten eval/results.json's tasks to ``task/metric`` -> value (accuracies etc.)."""
    out = {}
    for task, metrics in (evaluation.get("tasks") or {}).items():
        for metric, value in metrics.items():
            if metric in TABLE_METRICS and isinstance(value, int | float):
                out[f"{task}/{metric}"] = float(value)
    return out


def _task_cell(key: str, value: float | None, evaluation: dict[str, Any], sigmas: float) -> str:
    if value is None:
        return "-"
    task, _, metric = key.partition("/")
    if metric in ACCURACIES:
        examples = ((evaluation.get("tasks") or {}).get(task) or {}).get("examples")
        if at_chance(value, chance_of(task, evaluation), examples, sigmas):
            return f"at chance ({_fmt(value)})"
    return _fmt(value)


@dataclass(frozen=True)
class UnigramNote:
    prepared: Path
    loss: float | None  # None: the prepared data is not here
    tokens: int = 0
    fit_tokens: int = 0


def unigram_levels(runs: list[RunSummary]) -> dict[Path, UnigramNote]:
    """The unigram level (eval.unigram) of every prepared dataset the runs trained on."""
    from data_prep.dataset import load_prepared
    from data_prep.errors import DataPrepError
    from eval.unigram import unigram_level

    levels = {}
    for path in sorted({r.prepared for r in runs if r.prepared is not None}):
        try:
            level = unigram_level(load_prepared(path, verify_hashes=False))
        except DataPrepError:
            levels[path] = UnigramNote(path, None)
            continue
        levels[path] = UnigramNote(path, level.loss, level.tokens, level.fit_tokens)
    return levels


def quality_rows(
    runs: list[RunSummary], levels: dict[Path, UnigramNote] | None = None, sigmas: float = 2.0
) -> tuple[list[str], list[list[str]]]:
    levels = levels or {}
    task_keys = sorted({k for r in runs for k in _task_metrics(r.eval)})
    header = [
        "experiment",
        "model",
        "optimizer",
        "sparsity",
        "val loss",
        "val ppl",
        "vs AdamS",
        "vs unigram",
        *task_keys,
    ]
    base = {r.experiment: r.final_val_loss for r in runs if r.label == BASELINE}
    rows = []
    for r in runs:
        loss = r.final_val_loss
        ref = base.get(r.experiment)
        rel = None if loss is None or ref is None else f"{100 * (loss - ref) / ref:+.2f}%"
        unigram = levels.get(r.prepared) if r.prepared is not None else None
        gap = (
            None if loss is None or unigram is None or unigram.loss is None else loss - unigram.loss
        )
        tasks = _task_metrics(r.eval)
        rows.append([
            r.experiment, r.model, r.label, _fmt(r.sparsity, 2), _fmt(loss),
            _fmt(math.exp(loss) if loss is not None and loss < 50 else None, 1), rel or "-",
            f"{gap:+.3f}" if gap is not None else "-",
            *(_task_cell(k, tasks.get(k), r.eval, sigmas) for k in task_keys),
        ])  # fmt: skip
    return header, rows


def quality_notes(
    runs: list[RunSummary], levels: dict[Path, UnigramNote], sigmas: float
) -> list[str]:
    """The notes under the quality table: the unigram level, AdamS's distance to it, chance."""
    notes = []
    for level in levels.values():
        if level.loss is None:
            notes.append(
                f"Unigram level of {level.prepared}: not computed, the prepared data is not here "
                "(run the prepare stage, then the tables stage again)."
            )
            continue
        notes.append(
            f"Unigram level of {level.prepared.name}: {level.loss:.3f} nats per token, the cross "
            f"entropy over the {level.tokens:,} validation tokens of a unigram model fitted on "
            f"the {level.fit_tokens:,} train tokens with add-one smoothing (eval/unigram.py). "
            '"vs unigram" is val loss minus this level, in nats.'
        )
        for r in runs:
            loss = r.final_val_loss
            if r.label == BASELINE and r.prepared == level.prepared and loss is not None:
                gap = level.loss - loss
                where = "under" if gap >= 0 else "above"
                notes.append(
                    f"{r.experiment} ({r.model}): {BASELINE} ends {abs(gap):.3f} nats {where} "
                    "the unigram level."
                )
    rates = {t: chance_of(t, r.eval) for r in runs for t in (r.eval.get("tasks") or {})}
    rates = {t: c for t, c in sorted(rates.items()) if c is not None}
    if rates:
        listed = ", ".join(f"{t} {c:.3f}" for t, c in rates.items())
        notes.append(
            f'"at chance": an accuracy below, or within {sigmas:g} binomial standard errors '
            f"above, its task's chance rate c, sqrt(c(1-c)/n) over the task's n items (at least "
            f"1/n); not a "
            f"result. Chance rates (the local tasks' measured on their items: a last-word "
            f"guesser always answering the most frequent word): {listed}."
        )
    return notes


def _write_table(
    out: Path,
    stem: str,
    header: list[str],
    rows: list[list[str]],
    caption: str,
    notes: list[str] | None = None,
    footer: str = "",
) -> None:
    with open(out / f"{stem}.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    md = [
        f"| {' | '.join(header)} |",
        f"|{'|'.join('---' for _ in header)}|",
        *(f"| {' | '.join(r)} |" for r in rows),
    ]
    notes = notes or []
    md_notes = "".join(f"- {n}\n" for n in notes)
    (out / f"{stem}.md").write_text(
        f"{caption}\n\n" + "\n".join(md) + "\n" + (f"\n{footer}\n" if footer else "")
        + (f"\nNotes:\n\n{md_notes}" if notes else "")
    )  # fmt: skip

    def tex(s: str) -> str:
        return s.replace("%", r"\%").replace("_", r"\_").replace("#", r"\#")

    lines = [
        r"\begin{table}[t]", r"\centering", rf"\caption{{{tex(caption)}}}",
        rf"\begin{{tabular}}{{{'l' * 3}{'r' * (len(header) - 3)}}}", r"\toprule",
        " & ".join(tex(h) for h in header) + r" \\", r"\midrule",
        *(" & ".join(tex(c) for c in r) + r" \\" for r in rows),
        r"\bottomrule", r"\end{tabular}",
        *([r"\par\smallskip\footnotesize " + tex(footer)] if footer else []),
        *([r"\par\smallskip\footnotesize"] if notes else []),
        *(tex(n).replace("&", r"\&") + r"\\" for n in notes),
        r"\end{table}",
    ]  # fmt: skip
    (out / f"{stem}.tex").write_text("\n".join(lines) + "\n")


def plot_losses(runs: list[RunSummary], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for experiment in sorted({r.experiment for r in runs}):
        fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
        for r in (r for r in runs if r.experiment == experiment):
            steps = [m["step"] for m in r.metrics]
            losses = [m["loss"] for m in r.metrics]
            window = max(1, len(losses) // 25)  # a light moving average; raw curves are noisy
            smooth = [
                statistics.fmean(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))
            ]
            (line,) = ax_train.plot(steps, smooth, label=r.label, lw=1.4)
            vals = [(m["step"], m["val_loss"]) for m in r.metrics if "val_loss" in m]
            if vals:
                ax_val.plot(
                    *zip(*vals, strict=True), marker="o", color=line.get_color(), label=r.label
                )
        ax_train.set(
            title=f"{experiment}: training loss (moving average)", xlabel="step", ylabel="loss"
        )
        ax_val.set(title="validation loss", xlabel="step", ylabel="loss")
        for ax in (ax_train, ax_val):
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = out / f"loss_{experiment}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def run(cfg: TablesConfig | DictConfig) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)
    runs = collect_runs(Path(cfg.output_root), list(cfg.experiments))
    if not runs:
        raise FileNotFoundError(
            f"no runs with metrics under {cfg.output_root}/<experiment>/<run>/; run the pretrain stage first"
        )
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    levels = unigram_levels(runs)
    q_header, q_rows = quality_rows(runs, levels, cfg.chance_sigmas)
    e_header, e_rows, e_note = efficiency_table(runs, cfg.skip_steps)
    claims = paper_claims_line(runs)
    _write_table(
        out,
        "quality",
        q_header,
        q_rows,
        f"Quality: final validation loss and downstream accuracy ({commits_phrase(runs)})",
        quality_notes(runs, levels, cfg.chance_sigmas),
        footer=claims,
    )
    _write_table(
        out,
        "efficiency",
        e_header,
        e_rows,
        f"Efficiency: bytes per rank per step (median, steps > {cfg.skip_steps}; the last "
        f"column the mean over every step; {commits_phrase(runs)}).\n\n{e_note}",
        footer=claims,
    )
    write_manifest(runs, out / MANIFEST_FILE, cfg.output_root)
    figures = plot_losses(runs, out)
    reports = []
    if cfg.wandb_report:
        from pipelines.wandb_report import write_reports

        reports = write_reports(runs, out)
    return {
        "runs": len(runs),
        "out_dir": str(out),
        "figures": [str(p) for p in figures],
        "quality": (out / "quality.md").read_text(),
        "efficiency": (out / "efficiency.md").read_text(),
        "wandb_reports": reports,
    }


def commits_phrase(runs: list[RunSummary]) -> str:
    """Which code made the runs, for a caption: "runs of commit <sha>", or every commit."""
    commits = sorted({str(r.provenance.get("commit") or "unrecorded") for r in runs})
    dirty = sum(bool(r.provenance.get("dirty")) for r in runs)
    resumed = sum(bool(r.provenance.get("resumed")) for r in runs)
    text = ("runs of commit " if len(commits) == 1 else "runs of commits ") + ", ".join(
        c[:10] for c in commits
    )
    if dirty:
        text += f"; {dirty} with uncommitted changes"
    if resumed:
        text += f"; {resumed} resumed at another code version"
    return text


def paper_claims_line(runs: list[RunSummary]) -> str:
    """The abstract's claims for the experiments shown, in one line of their own."""
    shown = [e for e in PAPER_CLAIMS if any(r.experiment == e for r in runs)]
    if not shown:
        return ""
    listed = "; ".join(f"{e}: {PAPER_CLAIMS[e]}" for e in shown)
    return f"The paper's claims (its abstract; no table values are public), not ours: {listed}."


def write_manifest(runs: list[RunSummary], path: Path, output_root: str) -> dict[str, Any]:
    """What the tables were made of: the tables stage's commit, and per run its code
    version, full config, final metrics, and where its logs are (relative to the runs'
    root): a reader can trace every row to its run."""
    manifest = {
        "tables_commit": git_version(),
        "output_root": output_root,
        "runs": [
            {
                "experiment": r.experiment,
                "run": r.name,
                "optimizer": r.label,
                "provenance": r.provenance,
                "final": {
                    "val_loss": r.final_val_loss,
                    "steps": r.metrics[-1]["step"] if r.metrics else 0,
                    "tasks": _task_metrics(r.eval),
                    "bytes_per_step": r.bytes_per_step(0),
                },
                "logs": {
                    "metrics": f"{r.experiment}/{r.name}/{METRICS_FILE}",
                    "config": f"{r.experiment}/{r.name}/config.yaml",
                    "eval": f"{r.experiment}/{r.name}/eval/results.json",
                },
                "config": r.config,
            }
            for r in runs
        ],
    }
    path.write_text(json.dumps(manifest, indent=1, sort_keys=False, default=str) + "\n")
    return manifest


def report_lines(reports: list[dict[str, Any]]) -> list[str]:
    """What to tell the user about the W&B reports: their URLs, or how to publish them later."""
    from pipelines.wandb_report import PUBLISH

    lines = []
    offline = [r["json"] for r in reports if not r["url"]]
    for r in reports:
        if r["url"]:
            lines.append(f"W&B report {r['experiment']}: {r['url']}")
        elif r.get("error"):
            lines.append(f"W&B report {r['experiment']} not saved ({r['error']})")
    if offline:
        lines.append(f"W&B reports written offline: {', '.join(offline)}")
        lines.append(
            "publish them once the runs are synced (`wandb sync`, see README): "
            f"{PUBLISH} {' '.join(offline)}"
        )
    return lines


register_schema("tables", TablesConfig)


@hydra.main(config_path="../conf", config_name="tables", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(FileNotFoundError):
        result = run(cfg)
    print(result["quality"])
    print(result["efficiency"])
    for line in report_lines(result["wandb_reports"]):
        print(line)
    print(f"tables and figures in {result['out_dir']}/")


if __name__ == "__main__":
    main()
