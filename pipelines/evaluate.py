"""Hydra stage: evaluate an exported model (validation perplexity and lm-eval tasks).

    python -m pipelines.evaluate run_dir=runs/<experiment>/<run>          # local offline tasks
    python -m pipelines.evaluate export_dir=<dir> limit=100 device=cpu
    python -m pipelines.evaluate run_dir=<dir> eval_tasks=paper           # + standard set (hub)
    python -m pipelines.evaluate run_dir=<dir> 'tasks=[scape_nextsent,hellaswag]'

(`eval_tasks`, not `scale`: conf/scale/ is the pretrain stage's group and would be selected.)

Writes `<run_dir>/eval/results.json` (validation loss/ppl, every task's metrics, the local
tasks' manifest, lm-eval's task versions, package versions, the date) and prints a table.
The local tasks' data is built once into `<run_dir>/eval/tasks/` (eval.build_tasks).

`run(cfg)` does the work and is what tests call; `main` only adds the command line:
printing the table, and turning an `EvalError` into one `error: ...` line on stderr
with a non-zero exit code.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_prep.dataset import load_prepared
from data_prep.errors import DataPrepError
from data_prep.progress import quiet_bars_without_terminal
from eval.build_tasks import BuildConfig, ensure_tasks
from eval.config import EvaluateConfig, model_dir, output_path, validate
from eval.errors import EvalError
from eval.export import load_exported
from eval.harness import LOCAL_TASKS, run_tasks, summarize
from eval.offline import check_hub_tasks
from eval.perplexity import split_perplexity
from pipelines.stage import command_line, one_line_errors, register_schema

register_schema("evaluate", EvaluateConfig)


def run(cfg: EvaluateConfig | DictConfig, command: str | None = None) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        try:
            cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        except OmegaConfBaseException as err:
            raise EvalError(f"{err.msg}; set it on the command line (key=value)") from err
    assert isinstance(cfg, EvaluateConfig)
    validate(cfg)
    tasks = list(cfg.tasks)
    check_hub_tasks(tasks, LOCAL_TASKS)  # before minutes of model loading, not after
    model, tokenizer, meta = load_exported(
        model_dir(cfg), cfg.device, prepared_data_dir=cfg.prepared_data_dir
    )
    try:
        prepared = load_prepared(cfg.prepared_data_dir or meta.prepared_data_dir, False)
    except DataPrepError as err:
        raise EvalError(str(err)) from err
    out = output_path(cfg)
    validation = None
    if cfg.validation:
        validation = split_perplexity(
            model,
            prepared,
            seq_length=meta.shape.seq_length,
            batch_size=cfg.batch_size,
            max_windows=cfg.val_max_windows,
            progress=cfg.progress,
        ).as_dict()
    manifest, summary, lm_eval_info = None, {}, {}
    if any(t in LOCAL_TASKS for t in tasks):
        build = BuildConfig(seed=cfg.tasks_seed, examples=cfg.tasks_examples)
        manifest = ensure_tasks(prepared, build, out.parent / "tasks")
    if tasks:
        from eval.lm import ScapeLM

        lm = ScapeLM(
            loaded=(model, tokenizer, meta), batch_size=cfg.batch_size, progress=cfg.progress
        )
        raw = run_tasks(
            lm,
            tasks,
            metadata={"tasks_dir": str(out.parent / "tasks")},
            limit=cfg.limit,
            num_fewshot=cfg.num_fewshot,
            bootstrap_iters=cfg.bootstrap_iters,
            quiet=True,
        )
        summary = summarize(raw)
        lm_eval_info = {"task_versions": raw.get("versions", {}), "n-samples": raw["n-samples"]}
    document = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command or "pipelines.evaluate.run(cfg) (Python API)",
        "export": {
            "path": str(meta.path),
            "step": meta.step,
            "shape": asdict(meta.shape),
            "prepared_data_dir": str(prepared.path),
            "tokenizer": meta.tokenizer_name,
        },
        "validation": validation,
        "tasks": summary,
        "local_tasks": manifest,
        "lm_eval": lm_eval_info,
        "versions": {
            name: version(name) for name in ("lm_eval", "torch", "megatron-core", "datasets")
        },
        "config": asdict(cfg),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    document["output"] = str(out)
    return document


def table(document: dict[str, Any]) -> str:
    rows = [("task", "metric", "value", "stderr")]
    if document["validation"]:
        v = document["validation"]
        rows += [
            (f"{v['split']} ({v['tokens']:,} tok)", k, f"{v[k]:.4f}", "") for k in ("loss", "ppl")
        ]
    for task, metrics in document["tasks"].items():
        for name, value in metrics.items():
            if name.endswith("_stderr") or name == "examples":
                continue
            stderr = metrics.get(f"{name}_stderr")
            label = f"{task} (n={int(metrics.get('examples', 0))})"
            rows.append((label, name, f"{value:.4f}", "" if stderr is None else f"{stderr:.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_bars_without_terminal()
    with one_line_errors(EvalError, DataPrepError, status=1):
        document = run(cfg, command=command_line("pipelines.evaluate"))
    print(table(document))
    print(f"results: {document['output']}")


if __name__ == "__main__":
    main()
