"""Typed configuration of the evaluate stage (registered in Hydra's ConfigStore by
`pipelines.evaluate`, as `evaluate_schema`; tests build it directly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eval.errors import EvalError
from eval.export import export_dir
from eval.harness import LOCAL_TASKS

__all__ = ["EvaluateConfig", "model_dir", "output_path", "validate"]


@dataclass
class EvaluateConfig:
    # the pretrain run directory; its model is read from <run_dir>/export
    run_dir: str | None = None
    # an export directory (eval.export); overrides <run_dir>/export
    export_dir: str | None = None
    # the prepared data the model was trained on; null: the path recorded in the export
    prepared_data_dir: str | None = None
    # lm-eval task names; conf/eval_tasks/ holds the sets (local: offline, paper: + standard
    # zero-shot set, which needs the hub); empty: validation perplexity only
    tasks: list[str] = field(default_factory=lambda: list(LOCAL_TASKS))
    # examples per task (lm-eval's limit; below 1: a fraction); null: all
    limit: float | None = None
    num_fewshot: int = 0
    batch_size: int = 8
    device: str = "auto"  # auto: cuda when available, else cpu
    # perplexity over the prepared validation split, in windows of the model's seq_length
    validation: bool = True
    val_max_windows: int | None = None  # null: every window of the split
    # construction of the local tasks (eval.build_tasks.BuildConfig)
    tasks_seed: int = 1234
    tasks_examples: int = 500
    # bootstrap resamples for the stderr of perplexity-type metrics (0: none)
    bootstrap_iters: int = 1000
    # results file; null: <run_dir>/eval/results.json (without run_dir: <export_dir>/eval/...)
    output: str | None = None
    progress: bool = True


def model_dir(cfg: EvaluateConfig) -> Path:
    if cfg.export_dir:
        return Path(cfg.export_dir)
    if cfg.run_dir:
        return export_dir(cfg.run_dir)
    raise EvalError("set run_dir=<pretrain run directory> or export_dir=<exported model>")


def output_path(cfg: EvaluateConfig) -> Path:
    if cfg.output:
        return Path(cfg.output)
    base = Path(cfg.run_dir) if cfg.run_dir else model_dir(cfg)
    return base / "eval" / "results.json"


def validate(cfg: EvaluateConfig) -> None:
    model_dir(cfg)
    if cfg.batch_size < 1:
        raise EvalError(f"batch_size={cfg.batch_size} must be >= 1")
    if cfg.limit is not None and cfg.limit <= 0:
        raise EvalError(f"limit={cfg.limit} must be > 0 (or null for all examples)")
    if cfg.val_max_windows is not None and cfg.val_max_windows < 1:
        raise EvalError(f"val_max_windows={cfg.val_max_windows} must be >= 1 (or null)")
    if cfg.tasks_examples < 1:
        raise EvalError(f"tasks_examples={cfg.tasks_examples} must be >= 1")
