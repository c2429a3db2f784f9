"""A step sweep on disk, for the reader of ``megatron_step.json`` (the report)."""

import dataclasses
import json

import pytest

from benchmarks.harness.records import Point, Sweep


def _point(method: str, step_s: float, floor_s: float, speedup: float | None = None,
               **extra) -> Point:  # fmt: skip
    """``speedup`` against dense without overlap; with overlap and the faster: x0.8 of it."""
    fields = {"round": "w2-1gbit", "world_size": 2, "link": "1gbit", "method": method,
              "label": method, "step_s": step_s, "step_s_p25": step_s * 0.9,
              "step_s_p75": step_s * 1.1, "floor_s": floor_s, "bytes_per_rank": 1e6,
              "speedup_vs_no_overlap": speedup,
              "speedup_vs_overlap": None if speedup is None else speedup * 0.8,
              "speedup_vs_best_dense": None if speedup is None else speedup * 0.8,
              "predicted": None, "load_before": 0.3, "load_after": 1.2, "noisy": False}  # fmt: skip
    return Point(**{**fields, **extra})


@pytest.fixture
def make_point():
    """``make_point(method, step_s, floor_s, speedup, **fields)``: a 2-rank 1 Gbit/s point."""
    return _point


@pytest.fixture
def write_sweep():
    """``write_sweep(dir, points, **sweep_fields)`` writes ``dir/megatron_step.json``."""

    def write(bench_dir, points, **fields) -> None:
        doc = Sweep(points=points, **fields)
        (bench_dir / "megatron_step.json").write_text(json.dumps(dataclasses.asdict(doc)))

    return write
