"""The noise floor (pipelines/studies/noise_floor.py): reruns paired with their stored twin by
key, the host spread, and the rule that calls a gap below the floor level."""

from __future__ import annotations

import math

import pytest

from pipelines.studies import noise_floor
from pipelines.studies.run_index import RunIndex, RunKey, RunLog


def _run(seed, test, cpu="AMD EPYC, AVX-512", variant="adamw"):
    header = {"model": "llama", "variant": variant, "seed": seed, "steps": 400, "lr_scale": 1.0,
              "code": {"step_code": "v"}, "host": {"cpu": cpu}}  # fmt: skip
    return RunLog(header, [], {"final_val_loss": test, "final_test_loss": test})


def test_reruns_pair_by_key_and_the_spread_is_the_largest_relative_change():
    stored = RunIndex([_run(0, 4.0), _run(1, 4.2), _run(0, 5.0, variant="adams")])
    again = RunIndex([_run(0, 4.0, cpu="Intel Xeon, AVX-512"), _run(1, 4.221),
                      _run(2, 9.9)])  # fmt: skip  # seed 2 has no stored twin
    found = noise_floor.reruns(stored, again)
    assert [r.key for r in found] == [RunKey("llama", "adamw", 400, 1.0, s) for s in (0, 1)]
    assert noise_floor.host_spread(found) == pytest.approx(0.5)  # 4.221 over 4.2
    text = noise_floor.floor_text(found, noise_floor.hosts(stored))
    assert "2 same-config reruns" in text and "at most 0.500%" in text
    assert "(1 bit for bit)" in text and "reruns on AMD EPYC, AVX-512; Intel Xeon, AVX-512" in text
    assert noise_floor.host_spread([]) is None
    assert "no rerun yet" in noise_floor.floor_text([], ["AMD EPYC, AVX-512"])


def test_a_gap_within_the_floor_is_level_and_outside_it_ahead_or_behind():
    # mean +1.0, sd 1.0 over 3 seeds: twice the standard error is 1.155
    assert noise_floor.floor([0.0, 1.0, 2.0], None) == pytest.approx(2 / math.sqrt(3))
    assert noise_floor.standing([0.0, 1.0, 2.0], None) == "level"
    assert noise_floor.standing([0.9, 1.0, 1.1], None) == "behind"
    assert noise_floor.standing([-0.9, -1.0, -1.1], None) == "ahead"
    # the host spread raises the floor above the seeds' own
    assert noise_floor.standing([0.9, 1.0, 1.1], 1.5) == "level"
    assert noise_floor.floor([1.0], None) == math.inf  # one seed: nothing can be told apart
