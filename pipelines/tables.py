"""Hydra stage: collect finished runs into the paper's tables and loss-curve figures.

    python -m pipelines.tables                      # every experiment under runs/
    python -m pipelines.tables output_root=runs experiments=[gpt345m_owt_quality]

Writes ``<out_dir>/quality.{md,csv,tex}``, ``<out_dir>/efficiency.{md,csv,tex}``,
``<out_dir>/loss_<experiment>.png`` and ``<out_dir>/wandb_report.json`` (a W&B report spec:
panels that overlay the runs' loss curves, grouped by experiment).

Quality: final validation loss / perplexity (the evaluate stage's, over the whole validation
split; training's periodic estimate when a run has not been evaluated) and downstream
accuracy per optimizer.
Efficiency (``pipelines.efficiency``): bytes per rank per step from the runs; step time,
speed-up and time saved against dense AdamS only from an emulated-cluster step-time file
(``<output_root>/steptime.json``, written by ``make reproduce-table`` as root), else left out
with a note saying why: the runs' own step times are loopback CPU times, not a speed
measure. The paper's published headline figures (the abstract's; no table values are
public) sit in their own column.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pipelines.efficiency import STEP_TIMES_FILE, efficiency_table
from pipelines.training.config import sparsity_of
from pipelines.training.tracking import METRICS_FILE, read_metrics

__all__ = ["PAPER_CLAIMS", "TablesConfig", "collect_runs", "run"]

# The abstract's figures: (experiment, optimizer label) -> claim, for the "paper" column.
PAPER_CLAIMS = {
    ("llama500m_wallclock", "SCAPE-90"): "up to 43.3% less end-to-end time",
    ("llama500m_wallclock", "SCAPE-99"): "up to 43.3% less end-to-end time",
    ("llama500m_slimpj_quality", "SCAPE-90"): "quality comparable to dense; up to 43.3% less time",
    ("llama500m_slimpj_quality", "SCAPE-99"): "quality comparable to dense; up to 43.3% less time",
    ("llama1p8b_step", "SCAPE-90"): "up to 3.26x per step vs AdamS",
    ("llama1p8b_step", "SCAPE-99"): "up to 3.26x per step vs AdamS",
    ("gpt345m_owt_quality", "SCAPE-90"): "val loss and accuracy preserved",
    ("gpt345m_owt_quality", "SCAPE-99"): "val loss and accuracy preserved",
}
BASELINE = "AdamS"
ORDER = ["AdamW", "AdamS", "SCAPE-90", "SCAPE-99"]


@dataclass
class TablesConfig:
    output_root: str = "runs"
    experiments: list[str] = field(default_factory=list)  # empty: all found
    out_dir: str = "results/tables"
    skip_steps: int = 2  # steps left out of the byte medians (start-up, dense warm-up)
    # emulated-cluster step times (pipelines.efficiency); "" = <output_root>/steptime.json
    step_times: str = ""


@dataclass
class RunSummary:
    experiment: str
    name: str
    label: str
    model: str
    sparsity: float
    metrics: list[dict[str, Any]]
    eval: dict[str, Any]

    @property
    def final_val_loss(self) -> float | None:
        """The evaluate stage's loss over the whole validation split, else training's last estimate."""
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
        rows = [r.get("bytes") or {} for r in self.metrics if r["step"] > skip]
        kinds = sorted({k for row in rows for k in row})
        return {k: statistics.median(row.get(k, 0.0) for row in rows) for k in kinds}


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


def _task_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    """Flatten eval/results.json's tasks to ``task/metric`` -> value (accuracies etc.)."""
    out = {}
    for task, metrics in (evaluation.get("tasks") or {}).items():
        for metric, value in metrics.items():
            if metric in TABLE_METRICS and isinstance(value, int | float):
                out[f"{task}/{metric}"] = float(value)
    return out


def quality_rows(runs: list[RunSummary]) -> tuple[list[str], list[list[str]]]:
    task_keys = sorted({k for r in runs for k in _task_metrics(r.eval)})
    header = [
        "experiment",
        "model",
        "optimizer",
        "sparsity",
        "val loss",
        "val ppl",
        "vs AdamS",
        *task_keys,
        "paper",
    ]
    base = {r.experiment: r.final_val_loss for r in runs if r.label == BASELINE}
    rows = []
    for r in runs:
        loss = r.final_val_loss
        ref = base.get(r.experiment)
        rel = None if loss is None or ref is None else f"{100 * (loss - ref) / ref:+.2f}%"
        tasks = _task_metrics(r.eval)
        rows.append([
            r.experiment, r.model, r.label, _fmt(r.sparsity, 2), _fmt(loss),
            _fmt(math.exp(loss) if loss is not None and loss < 50 else None, 1), rel or "-",
            *(_fmt(tasks.get(k)) for k in task_keys), PAPER_CLAIMS.get((r.experiment, r.label), "-"),
        ])  # fmt: skip
    return header, rows


def _write_table(
    out: Path, stem: str, header: list[str], rows: list[list[str]], caption: str
) -> None:
    with open(out / f"{stem}.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    md = [
        f"| {' | '.join(header)} |",
        f"|{'|'.join('---' for _ in header)}|",
        *(f"| {' | '.join(r)} |" for r in rows),
    ]
    (out / f"{stem}.md").write_text(f"{caption}\n\n" + "\n".join(md) + "\n")

    def tex(s: str) -> str:
        return s.replace("%", r"\%").replace("_", r"\_").replace("#", r"\#")

    lines = [
        r"\begin{table}[t]", r"\centering", rf"\caption{{{tex(caption)}}}",
        rf"\begin{{tabular}}{{{'l' * 3}{'r' * (len(header) - 3)}}}", r"\toprule",
        " & ".join(tex(h) for h in header) + r" \\", r"\midrule",
        *(" & ".join(tex(c) for c in r) + r" \\" for r in rows),
        r"\bottomrule", r"\end{tabular}", r"\end{table}",
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


def wandb_report_spec(runs: list[RunSummary]) -> dict[str, Any]:
    """A report description: one section per experiment (a W&B group), loss panels overlaying runs."""
    return {
        "title": "SCAPE reproduction: loss curves",
        "project": "scape-repro",
        "sections": [
            {
                "group": experiment,
                "runs": sorted(r.name for r in runs if r.experiment == experiment),
                "panels": [
                    {"type": "line", "x": "step", "y": ["loss"], "smoothing": 0.6},
                    {"type": "line", "x": "step", "y": ["val_loss"]},
                    {"type": "line", "x": "tokens", "y": ["val_loss"]},
                    {
                        "type": "line",
                        "x": "step",
                        "y": ["bytes/grad_values", "bytes/param_values", "bytes/masks"],
                    },
                ],
            }
            for experiment in sorted({r.experiment for r in runs})
        ],
    }


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
    q_header, q_rows = quality_rows(runs)
    step_times = Path(cfg.step_times or Path(cfg.output_root) / STEP_TIMES_FILE)
    e_header, e_rows, e_note = efficiency_table(runs, cfg.skip_steps, step_times, PAPER_CLAIMS)
    _write_table(
        out, "quality", q_header, q_rows, "Quality: final validation loss and downstream accuracy"
    )
    _write_table(
        out,
        "efficiency",
        e_header,
        e_rows,
        f"Efficiency: bytes per rank per step (median, steps > {cfg.skip_steps}), step time on an "
        f"emulated cluster.\n\n{e_note}",
    )
    figures = plot_losses(runs, out)
    (out / "wandb_report.json").write_text(json.dumps(wandb_report_spec(runs), indent=1))
    return {
        "runs": len(runs),
        "out_dir": str(out),
        "figures": [str(p) for p in figures],
        "quality": (out / "quality.md").read_text(),
        "efficiency": (out / "efficiency.md").read_text(),
    }


def _register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="tables_schema", node=TablesConfig)


_register()


@hydra.main(config_path="../conf", config_name="tables", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        result = run(cfg)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(result["quality"])
    print(result["efficiency"])
    print(f"tables and figures in {result['out_dir']}/")


if __name__ == "__main__":
    main()
