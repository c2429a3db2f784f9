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
from pipelines.training.config import ConfigError, PretrainConfig, register_configs, validate
from pipelines.training.tracking import METRICS_FILE, read_metrics, run_name

__all__ = ["claim_run_dir", "main", "run", "run_dir_of", "train_joined_rank"]

register_configs()


def run_dir_of(cfg: PretrainConfig) -> Path:
    return Path(cfg.output_root) / cfg.experiment / run_name(cfg)


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
    """Draws rank 0's progress from metrics.jsonl while the ranks run (their output goes to logs/)."""

    def __init__(self, path: Path, total: int, enabled: bool, label: str) -> None:
        self.path, self.total, self.seen = path, total, 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="step", dynamic_ncols=True)

    def __call__(self) -> None:
        if self.bar is None:
            return
        records = read_metrics(self.path)
        if not records:
            return
        last = records[-1]
        step = int(last["step"])
        if step > self.seen:
            self.bar.update(step - self.seen if self.seen else step)
            self.seen = step
            post = {"loss": f"{last['loss']:.3f}"}
            val = next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None)
            if val is not None:
                post["val"] = f"{val:.3f}"
            self.bar.set_postfix(post)

    def close(self) -> None:
        if self.bar is not None:
            self()
            self.bar.close()


OPTIMIZER_BLOCKS = ("scape", "powersgd", "dgc", "onebit")
# Bookkeeping that never changes a run's numbers (resumption is exact whatever the interval).
BOOKKEEPING = (
    "log_interval",
    "checkpoint_interval",
    "keep_checkpoints",
    "consistency_check_interval",
)


def _settings(node: Any) -> dict[str, Any]:
    """What decides a run's numbers: the config less the progress bar, W&B, checkpoint and
    logging intervals, and the option blocks of optimizers the run does not use. A saved config from before an option was added gets
    that option's default, so adding options elsewhere never orphans an existing run."""
    merged = OmegaConf.merge(OmegaConf.structured(PretrainConfig), node)
    settings = OmegaConf.to_container(merged, resolve=True)
    for key in ("progress", "wandb"):
        settings.pop(key)
    for key in BOOKKEEPING:
        settings["train"].pop(key)
    optimizer = settings["optimizer"]
    for block in OPTIMIZER_BLOCKS:
        if optimizer["name"] != block:
            optimizer.pop(block, None)
    return settings


def claim_run_dir(cfg: PretrainConfig, run_dir: Path) -> None:
    """Write config.yaml, or check that an existing run directory holds this same run.

    Resuming (or calling finished) a run made with other settings would silently mix two
    experiments (see :func:`_settings` for what counts).
    """
    resolved = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    saved_path = run_dir / "config.yaml"
    if saved_path.is_file():
        try:
            same = _settings(OmegaConf.load(saved_path)) == _settings(OmegaConf.structured(cfg))
        except Exception:  # a key this version no longer has, a wrong type: not this run
            same = False
        if not same:
            raise ConfigError(
                f"{run_dir} holds a run with other settings (see its config.yaml); "
                "set run_name=<new name> or output_root=<other dir>, or delete that directory"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(resolved)


def train_joined_rank(
    rank: int, world_size: int, cfg: PretrainConfig, run_dir: Path
) -> dict[str, Any]:
    """This process's rank of a run whose process group is already up (a Slurm task, a
    benchmark rank): rank 0 claims the run directory, then every rank trains."""
    import torch.distributed as dist

    from pipelines.training.trainer import train_rank

    if rank == 0:
        claim_run_dir(cfg, run_dir)
    dist.barrier()
    return train_rank(rank, world_size, cfg, str(run_dir))


def run_local(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    from pipelines.training.trainer import train_rank
    from scape.testing import run_distributed

    claim_run_dir(cfg, run_dir)
    progress = _Progress(run_dir / METRICS_FILE, cfg.train.train_steps, cfg.progress, run_dir.name)
    try:
        results = run_distributed(
            train_rank,
            cfg.cluster.world_size,
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
    try:
        result = run(cfg)
    except (ConfigError, DataPrepError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
