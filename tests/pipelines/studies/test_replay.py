"""Replays: which stored runs are replayed, rebuilding a run's spec from its header, and
the bit-for-bit comparison. The replay itself, end to end: tests/pipelines/test_quality_study.py."""

from __future__ import annotations

import dataclasses

import pytest

from pipelines.studies.quality_config import ModelSpec, RunSpec, ScaleConfig, VariantSpec
from pipelines.studies.replay import differences, replay_set, spec_of
from pipelines.studies.run_index import RunLog


def _spec(seed: int = 0, steps: int = 30, lr: float = 1.0) -> RunSpec:
    model = ModelSpec(name="llama", family="llama", num_layers=1, hidden_size=32)
    scale = ScaleConfig(name="quick", steps=steps, lr=3e-3, min_lr=3e-4)
    variant = VariantSpec(method="scape", core=True, options={"sparsity": 0.99})
    return RunSpec(model, "scape99", variant, seed, scale, "data/corpus__bpe", lr)


def _log(spec: RunSpec, code: str = "v1", loss: float = 4.0) -> RunLog:
    """A run as train_run writes it."""
    header = {
        "run_id": spec.run_id, "fingerprint": spec.fingerprint(), "model": spec.model.name,
        "variant": spec.variant_name, "seed": spec.seed, "steps": spec.scale.steps,
        "lr_scale": spec.lr_scale, "code": {"commit": "c", "dirty": False, "step_code": code},
        "settings": {"model": vars(spec.model), "variant": vars(spec.variant),
                     "scale": {k: v for k, v in vars(spec.scale).items() if k != "models"}},
    }  # fmt: skip
    steps = [{"step": 10, "loss": loss, "lr": 1e-3}, {"step": 20, "loss": loss - 1, "lr": 2e-3}]
    return RunLog(header, steps, {"event": "final", "final_val_loss": loss, "seconds": 3.0})


def test_one_run_per_model_and_variant_the_cheapest() -> None:
    runs = [_log(_spec(seed=1, steps=30)), _log(_spec(seed=0, steps=300)),
            _log(_spec(seed=2, steps=30, lr=0.5)), _log(_spec(seed=2, steps=30, lr=1.0)),
            _log(_spec(seed=0, steps=10), code="v2")]  # fmt: skip
    (chosen,) = replay_set(runs, "v1")
    assert chosen.header["run_id"] == "llama__scape99__s1__t30"  # shortest, then seed 0 of those
    assert replay_set(runs, "v3") == []


def test_a_stored_run_rebuilds_its_spec_or_says_why_not() -> None:
    spec = _spec(seed=2, lr=0.5)
    assert spec_of(_log(spec), "elsewhere/data/corpus__bpe") == dataclasses.replace(
        spec, data_dir="elsewhere/data/corpus__bpe"
    )
    with pytest.raises(ValueError, match="llama__scape99__s2__t30__lr0.5: today's config"):
        spec_of(_log(spec), "data/another_corpus")  # the data is part of the fingerprint


def test_same_bits_ignore_only_the_code_stamp_and_the_wall_time() -> None:
    stored = _log(_spec())
    again = _log(_spec(), code="v2")
    again.final["seconds"] = 99.0
    assert differences(stored, again) is None
    again.steps[1]["loss"] = stored.steps[1]["loss"] + 1e-12  # one ulp-scale change
    assert (
        differences(stored, again) == f"step 20: loss {3.0!r} then, {again.steps[1]['loss']!r} now"
    )
    shorter = _log(_spec())
    shorter.steps.pop()
    assert differences(stored, shorter) == "2 step records then, 1 now"
    later = _log(_spec(), loss=4.0)
    later.final["final_val_loss"] = 4.5
    assert differences(stored, later) == "the final records differ"
    assert differences(stored, _log(_spec(seed=1))) == "the headers differ"
