"""The one training loop: schedule before step, evaluation cadence, and how a run ends."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pipelines.training.loop import FunctionSchedule, run_loop
from pipelines.training.simulator_engine import ScheduledGroups


class FakeEngine:
    """Records the lr and the step each call trained at; its loss is the step number."""

    def __init__(self) -> None:
        self.optimizer = ScheduledGroups(0.0, 0.0)
        self.calls: list[tuple[int, float]] = []

    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def step_on(self, data: Any, step: int, rank: int, micro_batch_size: int):
        self.calls.append((step, self.current_lr()))
        return SimpleNamespace(loss=float(step), grad_norm=1.0, updated=True, seconds=0.1)


class Hooks:
    def __init__(self, end_at: int | None = None, stop_at: int | None = None) -> None:
        self.end_at, self.stop_at, self.logged = end_at, stop_at, []

    def record(self, step: int, lr: float, result: Any) -> dict[str, Any]:
        return {"step": step, "lr": lr, "loss": result.loss}

    def ends_run(self, record: dict[str, Any]) -> bool:
        return record["step"] == self.end_at

    def evaluate(self) -> float:
        return -1.0

    def finish_step(self, record: dict[str, Any], last: bool) -> bool:
        self.logged.append((record, last))
        return record["step"] == self.stop_at


def _run(hooks: Hooks, start: int = 0, steps: int = 7):
    engine = FakeEngine()
    schedule = FunctionSchedule(engine.optimizer, lambda t: 0.1 * (t + 1), done=start)
    end = run_loop(engine, schedule, None, hooks, start=start, steps=steps, eval_interval=3,
                   micro_batch_size=1)  # fmt: skip
    return engine, end


def test_each_step_trains_at_its_scheduled_lr_and_evaluates_every_interval_and_at_the_end():
    hooks = Hooks()
    engine, end = _run(hooks)
    assert [t for t, _ in engine.calls] == list(range(7))
    assert [lr for _, lr in engine.calls] == [0.1 * (t + 1) for t in range(7)]
    assert [r["step"] for r, _ in hooks.logged if "val_loss" in r] == [3, 6, 7]
    assert [last for _, last in hooks.logged] == [False] * 6 + [True]
    assert end.step == 7 and end.record == hooks.logged[-1][0]


def test_a_resumed_run_takes_up_the_schedule_at_its_step():
    engine, end = _run(Hooks(), start=4)
    assert engine.calls == [(t, 0.1 * (t + 1)) for t in (4, 5, 6)]
    assert end.step == 7


def test_a_diverged_run_ends_with_an_evaluation_and_a_preempted_one_without():
    diverged = Hooks(end_at=4)
    _, end = _run(diverged)
    assert end.step == 4 and diverged.logged[-1] == (end.record, True)
    assert end.record["val_loss"] == -1.0
    preempted = Hooks(stop_at=5)
    _, end = _run(preempted)
    assert end.step == 5 and "val_loss" not in end.record and not preempted.logged[-1][1]


def test_no_step_left_is_no_step_taken():
    engine, end = _run(Hooks(), start=7)
    assert engine.calls == [] and end.step == 7 and end.record is None
