"""Hydra stage: pre-train a Megatron-Core GPT/Llama with dense AdamW, dense AdamS or SCAPE.

    python -m pipelines.pretrain                                   # tiny GPT, SCAPE-99, 2 CPU ranks
    python -m pipelines.pretrain optimizer=adams model=tiny_llama
    python -m pipelines.pretrain experiment=llama500m_slimpj_quality scale=tiny
    python -m pipelines.pretrain experiment=gpt345m_owt_quality scale=paper cluster=vista  # Slurm
    python -m pipelines.pretrain -m optimizer=adamw,adams,scape90,scape99                   # a sweep
    python -m pipelines.pretrain -m hydra/launcher=local optimizer=adamw,adams  # via submitit
    python -m pipelines.pretrain -m hydra/launcher=vista cluster=vista experiment=... optimizer=...

A run lives in ``<output_root>/<experiment>/<model>-<optimizer>-seed<seed>/``: metrics.jsonl,
checkpoints/, export/ (the final model for evaluation), summary.json, logs/ (one per rank).
Starting the same run again resumes from its newest valid checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from data_prep.dataset import load_prepared, prepared_dir
from data_prep.errors import DataPrepError
from data_prep.progress import Progress, quiet_bars_without_terminal
from pipelines.stage import one_line_errors
from pipelines.training.config import (
    ConfigError,
    PretrainConfig,
    register_configs,
    scape_config,
    validate,
)
from pipelines.training.runs import claim_run_dir, run_dir_of
from pipelines.training.tracking import METRICS_FILE, read_metrics

__all__ = ["main", "run"]

register_configs()


def _to_config(cfg: PretrainConfig | DictConfig) -> PretrainConfig:
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)
    validate(cfg)
    return cfg


def _check_data(cfg: PretrainConfig) -> None:
    path = prepared_dir(cfg.data_root, cfg.data.name, cfg.tokenizer.name)
    try:
        load_prepared(path, verify_hashes=False)
    except DataPrepError as err:
        raise DataPrepError(
            f"{err} (for this run: python -m pipelines.prepare data={cfg.data.name} "
            f"tokenizer={cfg.tokenizer.name} output_root={cfg.data_root})"
        ) from None


class _Progress:
    """Shows rank 0's progress from metrics.jsonl while the ranks run (their output goes to
    logs/): a bar on a terminal, a plain line every 30 s otherwise (data_prep.progress)."""

    def __init__(self, path: Path, total: int, enabled: bool, label: str) -> None:
        self.path = path
        # a resumed run's earlier steps are not this session's: the rate counts from there
        done = read_metrics(path) if enabled else []
        initial = int(done[-1]["step"]) if done else 0
        self.progress = Progress(total, label, unit="step", enabled=enabled, initial=initial)

    def __call__(self) -> None:
        if not self.progress.enabled:
            return
        records = read_metrics(self.path)
        if not records:
            return
        last = records[-1]
        val = next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None)
        self.progress.advance_to(int(last["step"]), loss=last["loss"], val=val)

    def close(self) -> None:
        self()
        self.progress.close()


def run_local(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    from pipelines.training.trainer import train_rank
    from scape.spawn import run_distributed

    claim_run_dir(cfg, run_dir)
    progress = _Progress(run_dir / METRICS_FILE, cfg.train.train_steps, cfg.progress, run_dir.name)
    try:
        # the simulator engine is one process, whatever W it simulates
        processes = cfg.cluster.world_size if cfg.train.engine == "megatron" else 1
        results = run_distributed(
            train_rank,
            processes,
            cfg,
            str(run_dir),
            timeout_s=7 * 24 * 3600,
            log_dir=run_dir / "logs",
            on_wait=progress,
        )
    finally:
        progress.close()
    return results[0]


def run(cfg: PretrainConfig | DictConfig) -> dict[str, Any]:
    """Validate, check the data, then train: on local ranks, as one task of a Slurm job,
    or by submitting to Slurm."""
    cfg = _to_config(cfg)
    run_dir = run_dir_of(cfg)
    o = cfg.optimizer
    if o.lr_multiplier != 1.0 or o.lr_multiplier_by_family:  # the configured lr is not all
        source = ("the recipe's for the " + cfg.model.family + " family"
                  if o.lr_multiplier_by_family.get(cfg.model.family) == o.lr_multiplier
                  else "optimizer.lr_multiplier")  # fmt: skip
        print(f"{o.label}: lr {o.scaled()['lr']:g} = train lr {o.lr:g} x {o.lr_multiplier:g} "
              f"({source}; min_lr likewise)", file=sys.stderr)  # fmt: skip
    if o.name == "scape" and o.scape.ramp_fraction:  # what the ramp is, in steps
        ramp = scape_config(o, cfg.train.train_steps)
        print(f"{o.label}: density ramp {ramp.ramp_start_k} -> {ramp.k} of every {ramp.chunk} "
              f"coefficients over the first {ramp.ramp_steps} sparse steps", file=sys.stderr)  # fmt: skip
    # Set by submitit inside its jobs: Hydra's submitit launcher (and our own Slurm jobs)
    # call this function once per task, and each task is one rank.
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        from pipelines.training.slurm import train_in_slurm_task

        _check_data(cfg)
        return train_in_slurm_task(cfg, run_dir)
    if cfg.cluster.launcher == "slurm":
        from pipelines.training.slurm import submit_pretrain

        return submit_pretrain(cfg, run_dir)
    _check_data(cfg)
    from pipelines.training.slots import run_slot

    slots = Path(cfg.output_root) / ".slots"
    with run_slot(slots, cfg.cluster.max_concurrent, on_wait=lambda m: print(m, file=sys.stderr)):
        return run_local(cfg, run_dir)


@hydra.main(config_path="../conf", config_name="pretrain", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_bars_without_terminal()
    with one_line_errors(ConfigError, DataPrepError):
        result = run(cfg)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
