"""W&B reports of finished experiments, built with W&B's own reports API (``wandb-workspaces``).

One report per experiment: line plots of training and validation loss against step and
against tokens, bytes per step by collective kind, and step time, all over a runset
filtered to the experiment's W&B group (every run of an experiment is logged with
``group=<experiment>``, see ``pipelines.training.tracking``).

    python -m pipelines.tables wandb_report=true          # build them (the tables stage)
    python -m pipelines.wandb_report publish results/tables/wandb_report_<experiment>.json

With ``WANDB_API_KEY`` set the tables stage saves each report to W&B at once. Offline it
writes the report's own JSON, the library's ``ReportViewspec`` model (what ``Report.save()``
sends and ``Report.from_url(..., as_model=True)`` returns), and prints the command above,
which loads that JSON back into a ``Report`` and saves it once runs are synced.

Nothing here talks to W&B until a report is saved: the runsets name no entity or project
(the library would look the project up on the server), so they show the report's own
project; ``publish`` fills them in just before saving.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.training.metrics import sent_by_kind

if TYPE_CHECKING:  # the library imports wandb (~1.5 s): only when a report is built
    import wandb_workspaces.reports.v2 as wr

# The runs are pipelines.tables.RunSummary objects (experiment, name, label, model, metrics,
# wandb_project, wandb_entity); not imported, as the tables stage imports this module.
RunSummary = Any

__all__ = [
    "BYTES_KINDS",
    "PANELS",
    "build_report",
    "load_report",
    "publish",
    "report_json",
    "report_path",
    "write_reports",
]

# The byte counters every optimizer logs (pipelines.training: bytes_last_step); a run that
# logs other kinds (the peers) adds its own.
BYTES_KINDS = ("grad_values", "param_values", "masks")
GRID_WIDTH = 24  # W&B's panel grid is 24 units wide; two panels per row
PUBLISH = "python -m pipelines.wandb_report publish"


@dataclass(frozen=True)
class PanelSpec:
    title: str
    x: str  # "Step" is W&B's own step axis (our runs log with step=<training step>)
    y: tuple[str, ...]
    smoothing: float | None = None


def panels_for(bytes_kinds: list[str]) -> list[PanelSpec]:
    return [
        PanelSpec("training loss vs step", "Step", ("loss",), smoothing=0.6),
        PanelSpec("validation loss vs step", "Step", ("val_loss",)),
        PanelSpec("training loss vs tokens", "tokens", ("loss",), smoothing=0.6),
        PanelSpec("validation loss vs tokens", "tokens", ("val_loss",)),
        PanelSpec(
            "bytes per step by kind (per rank)", "Step", tuple(f"bytes/{k}" for k in bytes_kinds)
        ),
        PanelSpec("step time (s)", "Step", ("step_time",)),
    ]


PANELS = panels_for(list(BYTES_KINDS))


def _stable_id(*parts: str) -> str:
    """An id of the library's form (11 base-36 characters), the same on every build."""
    number = int(hashlib.sha256("/".join(parts).encode()).hexdigest()[:16], 16)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while len(out) < 11:
        number, rest = divmod(number, 36)
        out += digits[rest]
    return out


def _bytes_kinds(runs: list[RunSummary]) -> list[str]:
    logged = {k for r in runs for m in r.metrics for k in sent_by_kind(m)}
    kinds = [k for k in BYTES_KINDS if k in logged] + sorted(logged - set(BYTES_KINDS))
    return kinds or list(BYTES_KINDS)


def _description(experiment: str, runs: list[RunSummary]) -> str:
    labels = ", ".join(dict.fromkeys(r.label for r in runs))
    models = ", ".join(sorted({r.model for r in runs}))
    return (
        f"{experiment}: {models} with {labels} ({len(runs)} runs, W&B group {experiment!r}). "
        "Made by `python -m pipelines.tables wandb_report=true`."
    )


def build_report(
    experiment: str, runs: list[RunSummary], *, project: str, entity: str | None
) -> wr.Report:
    """The report of one experiment; builds objects only, nothing is sent anywhere."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    runset = wr.Runset(name=experiment, filters=expr.And(expr.Metric("Group") == experiment))
    object.__setattr__(runset, "_id", _stable_id(experiment, "runset"))
    panels = []
    for i, spec in enumerate(panels_for(_bytes_kinds(runs))):
        half = GRID_WIDTH // 2
        panel = wr.LinePlot(
            title=spec.title,
            x=spec.x,
            y=list(spec.y),
            smoothing_factor=spec.smoothing,
            layout=wr.Layout(x=(i % 2) * half, y=(i // 2) * 8, w=half, h=8),
        )
        object.__setattr__(panel, "_id", _stable_id(experiment, spec.title))
        panels.append(panel)
    names = "\n".join(f"- {r.label}: `{r.name}`" for r in runs)
    return wr.Report(
        project=project,
        entity=entity or "",  # "" rather than None: None would ask the W&B server
        title=f"SCAPE reproduction: {experiment}",
        description=_description(experiment, runs),
        blocks=[
            wr.MarkdownBlock(
                text=f"Runs of W&B group `{experiment}` (one line per run):\n\n{names}"
            ),
            wr.PanelGrid(runsets=[runset], panels=panels),
        ],
    )


def report_json(report: wr.Report) -> str:
    """The library's own model of the report (``ReportViewspec``) as JSON."""
    model = report._to_model()  # the model Report.save() sends; there is no public alias
    return model.model_dump_json(by_alias=True, exclude_none=True, indent=1) + "\n"


def load_report(path: str | Path) -> wr.Report:
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.reports.v2 import internal

    model = internal.ReportViewspec.model_validate_json(Path(path).read_text())
    return wr.Report._from_model(model)  # what Report.from_url does with a saved report


def report_path(out_dir: str | Path, experiment: str) -> Path:
    return Path(out_dir) / f"wandb_report_{experiment}.json"


def publish(path: str | Path, entity: str | None = None, project: str | None = None) -> str:
    """Save an offline report to W&B (needs WANDB_API_KEY or `wandb login`); returns its URL."""
    import wandb_workspaces.reports.v2 as wr

    report = load_report(path)
    if project:
        report.project = project
    if entity:
        report.entity = entity
    if not report.entity:
        import wandb

        report.entity = wandb.Api().default_entity
    for block in report.blocks:
        if isinstance(block, wr.PanelGrid):
            for runset in block.runsets:
                runset.entity = runset.entity or report.entity
                runset.project = runset.project or report.project
    report.save()
    return str(report.url)


def online() -> bool:
    return bool(os.environ.get("WANDB_API_KEY"))


def write_reports(runs: list[RunSummary], out_dir: str | Path) -> list[dict[str, Any]]:
    """Build every experiment's report; save it when WANDB_API_KEY is set, else write its JSON.

    Project and entity come from the runs' own W&B config (``wandb.project``/``wandb.entity``).
    """
    results = []
    for experiment in sorted({r.experiment for r in runs}):
        mine = [r for r in runs if r.experiment == experiment]
        report = build_report(
            experiment, mine, project=mine[0].wandb_project, entity=mine[0].wandb_entity
        )
        path = report_path(out_dir, experiment)
        path.write_text(report_json(report))
        entry: dict[str, Any] = {"experiment": experiment, "json": str(path), "url": None}
        if online():
            try:
                entry["url"] = publish(path)
            except Exception as err:  # auth, network, GraphQL: the JSON stays for later
                entry["error"] = _one_line(err)
        results.append(entry)
    return results


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Save W&B reports written offline by `python -m pipelines.tables wandb_report=true`."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("publish", help="save report JSON files to W&B")
    cmd.add_argument("paths", nargs="+", help="results/tables/wandb_report_<experiment>.json")
    cmd.add_argument("--entity", default=None, help="default: the report's, else your default")
    cmd.add_argument("--project", default=None, help="default: the report's (the runs' project)")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not Path(path).is_file():
            print(
                f"error: {path} does not exist; build it with `python -m pipelines.tables wandb_report=true`",
                file=sys.stderr,
            )
            sys.exit(2)
    try:
        for path in args.paths:
            print(f"{path} -> {publish(path, args.entity, args.project)}")
    except Exception as err:  # the W&B client raises many types (auth, network, GraphQL)
        print(
            f"error: could not save the report ({_one_line(err)}); set WANDB_API_KEY "
            "or run `wandb login`, and `wandb sync` the runs first",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
