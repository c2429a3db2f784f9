"""Slurm submission of pretrain runs with submitit (TACC Vista: one GH200 per node).

Each run is one Slurm job of ``cluster.nodes`` nodes x ``cluster.ranks_per_node`` tasks;
every task is one data-parallel rank. The job is ``Checkpointable``: on preemption or time
limit submitit signals it, the trainer checkpoints at the next step boundary and the job is
requeued, then resumes from that checkpoint.

A sweep (``make reproduce-table SCALE=paper``) goes in as one job array per experiment, with
at most ``cluster.max_concurrent`` of its runs holding nodes at once.

``dry_run=true`` writes what would be submitted (the sbatch script and the resolved config)
to ``<run>/slurm/`` and submits nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.training.config import ConfigError, PretrainConfig
from pipelines.training.runs import claim_run_dir, train_joined_rank

__all__ = [
    "SlurmTrainJob",
    "slurm_parameters",
    "submit_pretrain",
    "submit_sweep",
    "train_in_slurm_task",
]


def train_in_slurm_task(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    """Inside a Slurm job (ours or Hydra's submitit launcher): this task is one rank.

    Joins the process group from Slurm's environment, claims the run directory on rank 0
    and trains this rank; every task of the job runs this.
    """
    import torch.distributed as dist
    from submitit.helpers import TorchDistributedEnvironment

    # overwrite: a MASTER_PORT already in the environment is what the helper read anyway.
    # All GPUs stay visible; the engine picks cuda:LOCAL_RANK.
    env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    if env.world_size != cfg.cluster.world_size:
        raise ConfigError(
            f"this Slurm job has {env.world_size} task(s) but cluster.nodes x cluster.ranks_per_node "
            f"= {cfg.cluster.world_size}; pass cluster=vista (or matching cluster.* values) "
            "together with hydra/launcher=vista"
        )
    dist.init_process_group(cfg.cluster.backend)
    try:
        return train_joined_rank(env.rank, env.world_size, cfg, run_dir)
    finally:
        dist.destroy_process_group()


class SlurmTrainJob:
    """The callable each Slurm task of our own submissions runs.

    Having a ``checkpoint`` method is what makes submitit requeue it on preemption/timeout.
    """

    def __call__(self, cfg: PretrainConfig, run_dir: str) -> dict[str, Any]:
        return train_in_slurm_task(cfg, Path(run_dir))

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeue with the same arguments; training resumes from its newest checkpoint."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


def slurm_parameters(cfg: PretrainConfig, job_name: str) -> dict[str, Any]:
    c = cfg.cluster
    if not c.account:
        raise ConfigError(
            "cluster.account is not set: export SLURM_ACCOUNT=<your allocation> (or pass cluster.account=...)"
        )
    return {
        "job_name": job_name,
        "partition": c.partition,
        "account": c.account,
        "nodes": c.nodes,
        "ntasks_per_node": c.ranks_per_node,
        "gpus_per_node": c.gpus_per_node or None,
        "cpus_per_task": c.cpus_per_task,
        "time": c.time_minutes,
        "setup": list(c.setup),
    }


def _write_dry_run(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    from submitit.slurm.slurm import _make_sbatch_string

    folder = run_dir / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    params = slurm_parameters(cfg, job_name=f"scape-{run_dir.name}")
    # submitit's own sbatch writer, so the dry run shows exactly what would be submitted.
    script = _make_sbatch_string(
        command="python -u -m submitit.core._submit '%j'", folder=str(folder), **params
    )
    (folder / "job.sbatch").write_text(script)
    return {"status": "dry_run", "run_dir": str(run_dir), "sbatch": str(folder / "job.sbatch")}


def submit_sweep(cfgs: list[PretrainConfig], run_dirs: list[Path]) -> list[dict[str, Any]]:
    """Submit runs with identical resources as one submitit job array, at most
    ``cluster.max_concurrent`` running at once (a single run is an array of one)."""
    for cfg, run_dir in zip(cfgs, run_dirs, strict=True):
        claim_run_dir(cfg, run_dir)
    first = cfgs[0]
    if first.dry_run:
        return [_write_dry_run(cfg, run_dir) for cfg, run_dir in zip(cfgs, run_dirs, strict=True)]
    name = f"scape-{run_dirs[0].name}" if len(cfgs) == 1 else f"scape-{first.experiment}"
    params = slurm_parameters(first, job_name=name)
    for cfg in cfgs[1:]:
        if slurm_parameters(cfg, job_name=name) != params:
            raise ConfigError(
                f"runs of one Slurm array need identical resources; {cfg.run_name} differs"
            )
    import submitit

    folder = run_dirs[0] / "slurm" if len(cfgs) == 1 else run_dirs[0].parent / "slurm"
    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    executor.update_parameters(
        name=params["job_name"],
        slurm_partition=params["partition"],
        slurm_account=params["account"],
        nodes=params["nodes"],
        tasks_per_node=params["ntasks_per_node"],
        gpus_per_node=params["gpus_per_node"],
        cpus_per_task=params["cpus_per_task"],
        timeout_min=params["time"],
        slurm_setup=params["setup"],
        slurm_array_parallelism=first.cluster.max_concurrent,
    )
    with executor.batch():
        jobs = [
            executor.submit(SlurmTrainJob(), cfg, str(d))
            for cfg, d in zip(cfgs, run_dirs, strict=True)
        ]
    return [
        {"status": "submitted", "job_id": job.job_id, "run_dir": str(d)}
        for job, d in zip(jobs, run_dirs, strict=True)
    ]


def submit_pretrain(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    return submit_sweep([cfg], [run_dir])[0]
