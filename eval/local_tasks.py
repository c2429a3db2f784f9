"""Where lm-eval gets the data of the local tasks (the `custom_dataset` of eval/tasks/*.yaml).

The task YAMLs are static, but their data belongs to one prepared dataset. lm-eval calls
`custom_dataset(**metadata)`, and its metadata holds everything in `--metadata` and in
`--model_args`; from that, in this order:

1. `tasks_dir=<dir>`: read `<dir>/<task>.jsonl`, as written by `python -m eval.build_tasks`
   or the evaluate stage (which always passes its own built directory);
2. `prepared=<prepared data dir>`, else `path=<export dir>` (the `scape` model's own
   argument: the export records the data the model was trained on): build the tasks in
   memory with the default construction and `tasks_seed` / `tasks_examples` if given.

So `--model_args path=<export>` alone is enough on the command line.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from data_prep.dataset import load_prepared
from data_prep.errors import DataPrepError
from eval.build_tasks import TASK_NAMES, BuildConfig, build_examples
from eval.errors import EvalError
from eval.export import read_meta

__all__ = ["load_lastword", "load_nextsent", "load_testppl"]


def load_lastword(**metadata: Any):
    return _dataset("scape_lastword", metadata)


def load_nextsent(**metadata: Any):
    return _dataset("scape_nextsent", metadata)


def load_testppl(**metadata: Any):
    return _dataset("scape_testppl", metadata)


def _dataset(task: str, metadata: dict[str, Any]):
    import datasets

    if metadata.get("tasks_dir"):
        rows = _read_jsonl(Path(metadata["tasks_dir"]) / f"{task}.jsonl")
    else:
        prepared = metadata.get("prepared") or _prepared_of_export(metadata.get("path"), task)
        cfg = BuildConfig()
        if metadata.get("tasks_seed") is not None:
            cfg = replace(cfg, seed=int(metadata["tasks_seed"]))
        if metadata.get("tasks_examples") is not None:
            cfg = replace(cfg, examples=int(metadata["tasks_examples"]))
        rows = _built(str(prepared), cfg)[task]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def _prepared_of_export(path: str | None, task: str) -> Path:
    if not path:
        raise EvalError(
            f"local task {task} needs its data: pass model_args path=<export dir> (scape model), "
            'or --metadata \'{"tasks_dir": "<dir from python -m eval.build_tasks>"}\''
        )
    return read_meta(path).prepared_data_dir


@lru_cache(maxsize=4)
def _built(prepared_dir: str, cfg: BuildConfig) -> dict[str, list[dict[str, Any]]]:
    """All tasks at once, once per process: lm-eval loads each task separately."""
    try:
        prepared = load_prepared(prepared_dir, verify_hashes=False)
    except DataPrepError as err:
        raise EvalError(str(err)) from err
    return build_examples(prepared, cfg)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise EvalError(
            f"{path} is missing; build the local tasks with `python -m eval.build_tasks "
            f"--prepared <data dir> --out {path.parent}` (tasks: {', '.join(TASK_NAMES)})"
        )
    with open(path, encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]
