"""One rank of a pre-training run: Megatron-Core model and optimizer, data, schedule,
evaluation, metrics, checkpoints and resume.

``train_rank(rank, world_size, cfg, run_dir)`` runs inside an initialized process group
(spawned locally by ``pipelines.pretrain`` or started by Slurm). Rank 0 writes the metrics
and the common part of checkpoints; every rank saves its own optimizer shard.

The steps themselves go through :func:`pipelines.training.loop.run_loop`, which the quality
studies' runs go through too. The loop and the simulator engine are therefore among the
studies' step sources (:data:`pipelines.studies.protocol.STEP_SOURCES`): a change to either
is a new code version, and ``make quality-replay`` decides whether the verdict's runs stand.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from data_prep.progress import Progress
from pipelines.training.checkpoint import (
    find_latest_valid,
    restore_training_state,
    save_training_state,
    step_of,
)
from pipelines.training.config import PretrainConfig
from pipelines.training.data import load_training_data
from pipelines.training.engine import build_engine
from pipelines.training.loop import megatron_schedule, run_loop
from pipelines.training.metrics import step_record, validation_loss
from pipelines.training.tracking import RunLogger

__all__ = ["train_rank"]


def _preemption_signals() -> list[signal.Signals]:
    # submitit asks for a checkpoint with USR2 (SUBMITIT_PREEMPT_SIGNAL overrides it);
    # Slurm preemption sends TERM; USR1 is what a plain `#SBATCH --signal` script would use.
    submitit_sig = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
    return list(dict.fromkeys([signal.SIGTERM, signal.SIGUSR1, submitit_sig]))


class _Preemption:
    """Preemption / time-limit signals -> checkpoint at the next step boundary.

    The handlers installed before ours (submitit's requeue handler, inside a submitit job)
    are kept and called by :meth:`hand_back` once the checkpoint is on disk, so submitit
    requeues a job whose state is already saved instead of exiting mid-step.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict[int, Any] = {}
        for sig in _preemption_signals():
            with contextlib.suppress(ValueError):  # not the main thread
                self.previous[sig] = signal.signal(sig, self._handle)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def hand_back(self) -> None:
        """Restore the earlier handlers and pass the received signal on to its one."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        handler = self.previous.get(self.received)
        if callable(handler):
            handler(self.received, None)


def _all_mean(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def _any(flag: bool) -> bool:
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def evaluate(training, data, rank: int, cfg: PretrainConfig) -> float:
    """The mean over data-parallel ranks of each rank's validation loss
    (:func:`~pipelines.training.metrics.validation_loss`, as the studies evaluate)."""
    per_rank = [
        validation_loss(training.runner, data.validation_batches(
            data_rank, cfg.train.eval_iters, cfg.train.micro_batch_size))
        for data_rank in training.data_ranks(rank)
    ]  # fmt: skip
    return _all_mean(sum(per_rank)) / len(per_rank)


def _resume(training, scheduler, run_dir: Path, log) -> int:
    """Load the newest valid checkpoint (rank 0 decides which); returns the step reached."""
    choice = [None]
    if dist.get_rank() == 0:
        path = find_latest_valid(run_dir / "checkpoints", dist.get_world_size(), log=log)
        choice = [str(path) if path else None]
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return 0
    path = Path(choice[0])
    restore_training_state(training, scheduler, path)
    return step_of(path)


def _build_scheduler(optimizer, cfg: PretrainConfig):
    o, t = cfg.optimizer, cfg.train
    lrs = o.scaled()
    return megatron_schedule(optimizer, lr=lrs["lr"], min_lr=lrs["min_lr"],
                             warmup_steps=t.warmup_steps, steps=t.train_steps,
                             weight_decay=o.weight_decay, decay_style=t.lr_decay_style)  # fmt: skip


class _PretrainSteps:
    """The pretrain stage's part of :func:`~pipelines.training.loop.run_loop`: records with
    the rank-mean loss and the step's speed, ``metrics.jsonl`` (and W&B), progress lines,
    consistency checks, step-interval checkpoints and preemption."""

    def __init__(self, cfg: PretrainConfig, training, scheduler, data, rank: int, run: Path,
                 logger, progress: Progress) -> None:  # fmt: skip
        self.cfg, self.training, self.scheduler, self.data = cfg, training, scheduler, data
        self.rank, self.run, self.logger, self.progress = rank, run, logger, progress
        self.preemption = _Preemption()
        self.tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_length
        self.val_loss: float | None = None  # the latest evaluation's
        self.preempted = False  # on every rank once any rank has been signalled

    def record(self, step: int, lr: float, result) -> dict[str, Any]:
        loss = _all_mean(result.loss)
        if not math.isfinite(loss):
            self.logger.warn(f"step {step}: non-finite loss {loss}")
        sent = self.training.bytes_last_step()
        return {
            **step_record(step, self.tokens_per_step, loss, lr, result, sent),
            "bytes_by_kind": sent,
            "step_time": result.seconds,
            "tokens_per_s": self.tokens_per_step / result.seconds,
        }

    def ends_run(self, record: dict[str, Any]) -> bool:
        return False  # a pretrain run trains its steps (a non-finite loss is warned about)

    def evaluate(self) -> float:
        self.val_loss = evaluate(self.training, self.data, self.rank, self.cfg)
        return self.val_loss

    def finish_step(self, record: dict[str, Any], last: bool) -> bool:
        step, t = record["step"], self.cfg.train
        if step % t.consistency_check_interval == 0:
            self.training.check_consistency(step)
        self.logger.log(record)
        self.progress.advance_to(step, loss=record["loss"], val=self.val_loss)
        self.preempted = _any(self.preemption.requested)
        if step % t.checkpoint_interval == 0 or last or self.preempted:
            save_training_state(self.training, self.scheduler, step, self.run / "checkpoints",
                                keep=t.keep_checkpoints)  # fmt: skip
        return self.preempted


def train_rank(rank: int, world_size: int, cfg: PretrainConfig, run_dir: str) -> dict[str, Any]:
    """Train (or resume) until ``cfg.train.train_steps``; returns a summary (rank 0's is written)."""
    run = Path(run_dir)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t = cfg.train
    # data-parallel ranks: the processes (Megatron engine) or the simulated workers
    data_world = cfg.cluster.world_size
    batch_per_rank = t.global_batch_size // data_world
    training = build_engine(cfg)
    scheduler = _build_scheduler(training.optimizer, cfg)
    logger = RunLogger(run, cfg, enabled=rank == 0)
    start_step = _resume(training, scheduler, run, logger.warn)
    if start_step >= t.train_steps and (run / "summary.json").is_file():
        logger.warn(f"{run} already finished at step {start_step}; nothing to do")
        return json.loads((run / "summary.json").read_text()) | {"status": "already finished"}
    logger.start(resumed_from=start_step)
    data = load_training_data(
        training.data_dir,
        seed=t.seed,
        seq_length=cfg.model.seq_length,
        world_size=data_world,
        batch_per_rank=batch_per_rank,
        steps=t.train_steps,
        cache_dir=run / "dataset_cache",
    )
    # Rank 0's plain progress lines: the Slurm job's log (a local run's launcher draws the
    # bar from metrics.jsonl; there these lines go to logs/rank0.log)
    progress = Progress(
        t.train_steps,
        run.name,
        unit="step",
        enabled=rank == 0 and cfg.progress,
        stream=sys.stdout,
        initial=start_step,
        bar=False,
    )
    run_start = time.perf_counter()
    started_at = time.time()
    steps = _PretrainSteps(cfg, training, scheduler, data, rank, run, logger, progress)
    end = run_loop(training, scheduler, data, steps, start=start_step, steps=t.train_steps,
                   eval_interval=t.eval_interval, micro_batch_size=t.micro_batch_size,
                   rank=rank)  # fmt: skip
    step = end.step
    if steps.preempted:
        progress.close()
        logger.warn(f"preemption requested: checkpointed at step {step}, exiting for requeue")
        logger.finish()
        steps.preemption.hand_back()  # inside submitit: requeue now that the checkpoint exists
        return {"status": "preempted", "step": step}
    summary = {
        "status": "finished",
        "step": step,
        "resumed_from": start_step,
        "final_val_loss": steps.val_loss,
        "wall_clock_s_this_session": time.perf_counter() - run_start,
        "session_started_at": started_at,  # unix time, for telling concurrent runs apart
        "finished_at": time.time(),
        "config": asdict(cfg),
    }
    progress.close()
    training.sync_params()  # collective: every rank, before rank 0 reads the params
    if rank == 0:
        training.export(run / "export", step)
        (run / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    logger.finish()
    return {k: v for k, v in summary.items() if k != "config"}
