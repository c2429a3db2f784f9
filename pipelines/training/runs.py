"""A pretrain run's directory: where it lives, claiming it for one run's settings, and
training one rank of a joined process group in it.

Shared by the pretrain stage (local ranks) and the Slurm tasks (:mod:`pipelines.training.slurm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pipelines.training.config import ConfigError, PretrainConfig
from pipelines.training.provenance import record_provenance
from pipelines.training.tracking import run_name

__all__ = ["claim_run_dir", "holds_other_run", "run_dir_of", "set_aside", "train_joined_rank"]


def run_dir_of(cfg: PretrainConfig) -> Path:
    return Path(cfg.output_root) / cfg.experiment / run_name(cfg)


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
    logging intervals, the recipe's per-family lr table (the applied multiplier stays), and
    the option blocks of optimizers the run does not use. A saved config from before an option was added gets
    that option's default, so adding options elsewhere never orphans an existing run."""
    merged = OmegaConf.merge(OmegaConf.structured(PretrainConfig), node)
    settings = OmegaConf.to_container(merged, resolve=True)
    for key in ("progress", "wandb"):
        settings.pop(key)
    for key in BOOKKEEPING:
        settings["train"].pop(key)
    optimizer = settings["optimizer"]
    # the recipe's table of multipliers: the one applied is optimizer.lr_multiplier (compared),
    # so a new recipe for another family does not orphan a run
    optimizer.pop("lr_multiplier_by_family", None)
    for block in OPTIMIZER_BLOCKS:
        if optimizer["name"] != block:
            optimizer.pop(block, None)
    return settings


def holds_other_run(cfg: PretrainConfig, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run made with settings other than ``cfg``'s (see
    :func:`_settings`); False when it holds none."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return False
    try:
        return _settings(OmegaConf.load(saved_path)) != _settings(OmegaConf.structured(cfg))
    except Exception:  # a key this version no longer has, a wrong type: not this run
        return True


SUPERSEDED = ".superseded"  # <output_root>/<experiment>/.superseded/: runs set aside


def set_aside(run_dir: Path) -> Path:
    """Move ``run_dir`` to ``<experiment dir>/.superseded/<name>-<UTC time>`` (nothing is
    deleted; one level deeper than runs, so the tables stage does not read it as one);
    returns the new path."""
    import time

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = run_dir.parent / SUPERSEDED / f"{run_dir.name}-{stamp}"
    target.parent.mkdir(exist_ok=True)
    run_dir.rename(target)
    return target


def claim_run_dir(cfg: PretrainConfig, run_dir: Path) -> None:
    """Write config.yaml, or check that an existing run directory holds this same run.

    Resuming (or calling finished) a run made with other settings would silently mix two
    experiments (see :func:`_settings` for what counts).
    """
    resolved = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    saved_path = run_dir / "config.yaml"
    if holds_other_run(cfg, run_dir):
        raise ConfigError(
            f"{run_dir} holds a run with other settings (see its config.yaml); "
            "set run_name=<new name> or output_root=<other dir>, or delete that directory"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(resolved)
    record_provenance(run_dir)


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
