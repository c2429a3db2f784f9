"""Run lm-eval tasks on a loaded model and flatten lm-eval's results.

The task manager indexes `eval/tasks/` always and lm-eval's ~15,000 bundled task configs
only when a standard task is asked for: that indexing alone takes 15-60 s of CPU, which
the local tasks do not need.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from eval.build_tasks import TASK_NAMES
from eval.errors import EvalError
from eval.offline import check_hub_tasks, hub_load_error

__all__ = ["LOCAL_TASKS", "TASKS_DIR", "run_tasks", "summarize"]

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
LOCAL_TASKS = TASK_NAMES


def run_tasks(
    lm: Any,
    tasks: list[str],
    *,
    metadata: dict[str, Any],
    limit: float | None = None,
    num_fewshot: int | None = 0,
    bootstrap_iters: int = 1000,
    quiet: bool = True,
) -> dict[str, Any]:
    """lm-eval's results dict for `tasks` on `lm` (an `lm_eval.api.model.LM`).

    `metadata` reaches the local tasks' data loaders (eval.local_tasks): `tasks_dir`, or
    `path`/`prepared`. `bootstrap_iters` only affects stderr of non-mean metrics
    (perplexity); lm-eval's default of 100,000 takes minutes on a CPU, 0 skips them.
    """
    check_hub_tasks(tasks, LOCAL_TASKS)
    if quiet:
        # lm-eval logs every config at INFO and warns, for every custom_dataset task, about a
        # --metadata option that the stage sets itself; the stage prints its own summary
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    remote = [t for t in tasks if t not in LOCAL_TASKS]
    manager = TaskManager(
        include_path=str(TASKS_DIR), include_defaults=bool(remote), metadata=metadata
    )
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise EvalError(
            f"unknown task {unknown[0]}; local tasks: {', '.join(LOCAL_TASKS)} "
            "(lm-eval's own names, e.g. hellaswag, need the hub)"
        )
    try:
        loaded = manager.load(tasks)
    except EvalError:
        raise
    except Exception as err:  # datasets/hub failures come in many types
        if remote:
            raise hub_load_error(remote, LOCAL_TASKS, err) from err
        raise
    return evaluator.simple_evaluate(
        model=lm,
        tasks=list(loaded["tasks"].values()),
        task_manager=manager,
        num_fewshot=num_fewshot,
        limit=limit,
        bootstrap_iters=bootstrap_iters,
        log_samples=False,
    )


def summarize(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """`{task: {metric: value, metric_stderr: value, examples: n}}` from lm-eval's results."""
    summary: dict[str, dict[str, float]] = {}
    for task, metrics in results["results"].items():
        row: dict[str, float] = {}
        for key, value in metrics.items():
            metric, sep, filt = key.partition(",")
            if not sep or not isinstance(value, int | float):
                continue  # "alias", or a stderr lm-eval reports as "N/A"
            row[metric if filt == "none" else f"{metric}[{filt}]"] = float(value)
        samples = results.get("n-samples", {}).get(task)
        if samples:
            row["examples"] = samples["effective"]
        summary[task] = row
    return summary
