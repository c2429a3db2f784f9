"""The efficiency table of the tables stage: bytes per rank per step from the runs.

The runs of ``make reproduce-table`` train on CPU processes that talk over loopback on a
shared machine; their step times say nothing about a bandwidth-limited cluster (a fresh run
once printed SCAPE-99 at "0.56x, -81.7% time saved"). So the table never turns them into a
speed-up, and has no speed columns: speed is measured on an emulated cluster by ``make
bench-step`` and reported in ``results/bench/README.md``; the note under the table says so.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["SPEED_NOTE", "efficiency_table"]

SPEED_NOTE = (
    "No speed columns: the runs' own step times are CPU processes on loopback, not a speed "
    "measure; speed is measured on an emulated cluster by `make bench-step` "
    "(results/bench/README.md)."
)


class _Run(Protocol):  # what the tables stage's RunSummary offers
    experiment: str
    label: str

    def bytes_per_step(self, skip: int) -> dict[str, float]: ...

    def run_bytes_per_step(self) -> float: ...


def efficiency_table(runs: list[_Run], skip: int) -> tuple[list[str], list[list[str]], str]:
    """Header, rows and a one-paragraph note for ``efficiency.{md,csv,tex}``: the steady
    step's bytes by kind (medians), and the mean over the whole run, which counts a dense
    first step and the shipped SCAPE-99's density ramp (denser early steps)."""
    header = ["experiment", "optimizer", "MB/step/rank", "grad MB", "param MB", "mask MB",
              "run mean MB/step"]  # fmt: skip
    rows = []
    for r in runs:
        b = r.bytes_per_step(skip)
        rows.append([r.experiment, r.label, f"{sum(b.values()) / 1e6:.3f}",
                     f"{b.get('grad_values', 0.0) / 1e6:.3f}",
                     f"{b.get('param_values', 0.0) / 1e6:.3f}",
                     f"{b.get('masks', 0.0) / 1e6:.3f}",
                     f"{r.run_bytes_per_step() / 1e6:.3f}"])  # fmt: skip
    return header, rows, SPEED_NOTE
