"""The step sweep's records (``megatron_step.json``): a :class:`Sweep` of :class:`Round` per rank
count and link rate, and the :class:`Point` figures derived from them; :func:`from_json` refuses
a key they do not have, so a file of another format fails loudly instead of half-read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "MethodSteps", "Point", "Quiet", "Round", "Sweep", "from_json"]


@dataclass
class Quiet:
    """The quiet protocol's record of a round (:func:`benchmarks.harness.quiet.run_round`)."""

    attempts: list[dict[str, Any]]
    load_before: float
    load_after: float
    other_cores: float
    host_ms_before: float
    host_ms_after: float
    noisy: bool
    noisy_reason: str | None = None


@dataclass
class MethodSteps:
    """One method's steps in a round (or its floor), each at its slowest rank."""

    label: str
    optimizer: str
    model: str
    n_params: int
    buckets: int
    value_collectives: int  # gradient-sync calls per step: one per bucket, or one when fused
    overlap_grad_reduce: bool
    values_in_grad_sync: bool  # SCAPE: values all-reduced in the gradient sync, masks ahead
    tokens_per_rank_step: int
    step_s_all: list[float]
    bytes_per_rank: dict[str, float]  # as rank 0's engine counts them (ring accounting)
    loss_last: float | None = None

    @property
    def step_s(self) -> float:
        return _quantile(self.step_s_all, 2)

    @property
    def quartiles(self) -> tuple[float, float]:
        return _quantile(self.step_s_all, 1), _quantile(self.step_s_all, 3)


@dataclass
class Call:
    """One of a method's collectives, timed bare at the size its step sent."""

    kind: str
    op: str
    nbytes: int
    times: list[float]  # per repetition, at the slowest rank

    @property
    def seconds(self) -> float:
        return _quantile(self.times, 2)


@dataclass
class Round:
    name: str
    world_size: int
    link: str
    rate_mbit: float | None
    methods: dict[str, MethodSteps] = field(default_factory=dict)
    floors: dict[str, MethodSteps] = field(default_factory=dict)
    calls: dict[str, list[Call]] = field(default_factory=dict)
    forward_s: float | None = None  # a dense method's forward and backward, floor launch
    backward_s: float | None = None
    quiet: Quiet | None = None
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Point:
    """One (round, method): the figures of section 2 of the report and its targets."""

    round: str
    world_size: int
    link: str
    method: str
    label: str
    step_s: float
    step_s_p25: float
    step_s_p75: float
    floor_s: float | None
    bytes_per_rank: float
    speedup_vs_no_overlap: float | None  # median of same-step ratios, dense without overlap
    speedup_vs_overlap: float | None
    speedup_vs_best_dense: float | None  # against the faster dense step at each step
    predicted: dict[str, float] | None
    load_before: float | None
    load_after: float | None
    noisy: bool

    @property
    def step_over_floor(self) -> float | None:
        return self.step_s / self.floor_s if self.floor_s else None

    @property
    def comm_over_compute(self) -> float | None:  # exposed time over compute
        return (self.step_s - self.floor_s) / self.floor_s if self.floor_s else None

    @property
    def model_error(self) -> float | None:
        return self.predicted["total"] / self.step_s - 1.0 if self.predicted else None


@dataclass
class Sweep:
    """``megatron_step.json``; only ``skipped`` (why) when the cluster could not be built."""

    skipped: str | None = None
    commit: str | None = None
    started_at: str = ""
    finished_at: str | None = None
    complete: bool = False
    loopback: bool = False
    host: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    bench_model: list[str] = field(default_factory=list)
    steps: int = 0
    warmup: int = 0
    rounds: dict[str, Round] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)


def _quantile(xs: list[float], quarter: int) -> float:
    """A quartile, inclusive method (``statistics.quantiles`` wants two points in Python 3.11)."""
    s = sorted(xs)
    pos = (len(s) - 1) * quarter / 4
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def from_json(kind: Any, value: Any) -> Any:
    """``value`` (plain JSON; ``dataclasses.asdict`` of a record) as ``kind``, a record class or
    a typed list/dict of them; a key the record does not have is an error naming it."""
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind)}
        if unknown := sorted(set(value) - names):
            raise ValueError(f"{kind.__name__}: unknown keys {unknown} (a file of another "
                             "format: archive it and re-run the benchmark that wrote it)")  # fmt: skip
        return kind(**{k: from_json(hints[k], v) for k, v in value.items()})
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return None if value is None else from_json(inner[0], value)
    if origin is list:
        return [from_json(args[0], v) for v in value]
    if origin is dict:
        return {k: from_json(args[1], v) for k, v in value.items()}
    return value
