"""The training loop every run goes through: the pretrain stage's ranks and the quality
studies' simulated workers.

One loop, two engines. Each step the loop advances the lr schedule, runs the engine's step on
the step's batches, evaluates on the run's cadence and hands the step to the run's
:class:`LoopHooks`, which say what a step's record holds, where it goes, when state is saved
and when a run ends early:

- the pretrain stage (:mod:`pipelines.training.trainer`): Megatron ranks or the simulator
  engine, Megatron's lr scheduler, ``metrics.jsonl`` and W&B, step-interval checkpoints,
  preemption;
- the quality studies (:mod:`pipelines.studies.quality_run`): the simulator engine over the
  study's simulator (or a reading's), the study's schedule, its JSONL, the divergence rule and
  wall-time checkpoints.

An engine has ``current_lr()`` and ``step_on(data, step, rank, micro_batch_size)``
(:class:`pipelines.training.engine_base.EngineCommon`); a schedule has Megatron's
``OptimizerParamScheduler.step(increment)``, which sets the engine's param groups' lr.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["FunctionSchedule", "LoopEnd", "LoopHooks", "megatron_schedule", "run_loop"]

Record = dict[str, Any]


class LoopHooks(Protocol):
    """What a run adds to the loop."""

    def record(self, step: int, lr: float, result: Any) -> Record:
        """The record of step ``step`` (1-based: steps done) trained at ``lr``; ``result`` is
        the engine's :class:`~scape.megatron.train.StepResult`."""
        ...

    def ends_run(self, record: Record) -> bool:
        """True when this step is the run's last although steps remain (divergence)."""
        ...

    def evaluate(self) -> float:
        """The validation loss of the model as it is now."""
        ...

    def finish_step(self, record: Record, last: bool) -> bool:
        """Log the record (with ``val_loss`` on an evaluation step) and save what is due;
        True stops the run after this step (preemption, or a divergence seen in the
        validation loss)."""
        ...


@dataclass(frozen=True)
class LoopEnd:
    step: int  # steps done when the loop returned
    record: Record | None  # the last step's record (None: no step ran)


def run_loop(
    engine: Any,
    schedule: Any,
    data: Any,
    hooks: LoopHooks,
    *,
    start: int,
    steps: int,
    eval_interval: int,
    micro_batch_size: int,
    rank: int = 0,
) -> LoopEnd:
    """Train from ``start`` (steps done) until ``steps`` or until ``hooks`` end the run.

    ``data`` is a :class:`~pipelines.training.data.TrainingData`; the engine takes its own
    ranks' batches of each step from it. Every ``eval_interval`` steps and at the last one the
    record gets ``val_loss``.
    """
    step, record = start, None
    while step < steps:
        # Advance first: the scheduler sets the lr for its `num_steps`, so step 1 gets the
        # first warm-up lr rather than Megatron's lr_warmup_init of 0.
        schedule.step(1)
        lr = engine.current_lr()
        result = engine.step_on(data, step, rank, micro_batch_size)
        step += 1
        record = hooks.record(step, lr, result)
        last = hooks.ends_run(record) or step == steps
        if last or step % eval_interval == 0:
            record["val_loss"] = hooks.evaluate()
        if hooks.finish_step(record, last) or last:
            break
    return LoopEnd(step, record)


class FunctionSchedule:
    """An lr schedule given as a function of the 0-based step, behind the calls the loop makes
    of Megatron's ``OptimizerParamScheduler``: :meth:`step` sets every param group's lr.

    ``lr_at(t)`` is the lr of the step that follows ``t`` steps done; ``done``: steps already
    taken (a resumed run's)."""

    def __init__(self, optimizer: Any, lr_at: Callable[[int], float], done: int = 0) -> None:
        self.optimizer, self.lr_at, self.num_steps = optimizer, lr_at, done

    def step(self, increment: int) -> None:
        lr = self.lr_at(self.num_steps)
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)

    def state_dict(self) -> dict[str, int]:
        return {"num_steps": self.num_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.num_steps = state["num_steps"]


def megatron_schedule(
    optimizer: Any,
    *,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    steps: int,
    weight_decay: float,
    decay_style: str = "cosine",
) -> Any:
    """Megatron's ``OptimizerParamScheduler`` as the pretrain stage sets it up: linear warm-up
    from 0 to ``lr`` (none: ``lr`` from the start), then ``decay_style`` to ``min_lr`` at the
    last step; constant weight decay."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if warmup_steps else lr,
        max_lr=lr,
        min_lr=min_lr,
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=max(steps, warmup_steps + 1),
        lr_decay_style=decay_style,
        start_wd=weight_decay,
        end_wd=weight_decay,
        wd_incr_steps=steps,
        wd_incr_style="constant",
    )
