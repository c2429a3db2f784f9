"""One quality-study run: its lr schedule, when a run counts as finished, and the checkpoint
an interrupted run resumes from."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.studies.quality_config import RunSpec
from pipelines.studies.quality_run import completed_run, lr_at


def test_lr_schedule_warms_up_then_decays_to_min(compose_study) -> None:
    scale = compose_study().scale
    lrs = [lr_at(t, scale) for t in range(scale.steps)]
    assert lrs[0] == pytest.approx(scale.lr / scale.warmup_steps)
    assert max(lrs) == pytest.approx(scale.lr)
    assert lrs[-1] == pytest.approx(scale.min_lr, rel=1e-3)
    assert all(
        a >= b
        for a, b in zip(lrs[scale.warmup_steps :], lrs[scale.warmup_steps + 1 :], strict=False)
    )


def test_the_study_schedule_is_megatrons_with_its_cosine_one_step_behind(compose_study) -> None:
    """What quality_run's docstring states of the study's schedule against the one users'
    runs get (Megatron's scheduler, as the pretrain stage builds it), both driven by the loop's
    calls: the same warm-up, then the study's lr at step t is Megatron's at t - 1."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from pipelines.training.loop import FunctionSchedule
    from pipelines.training.simulator_engine import ScheduledGroups

    scale = replace(compose_study().scale, steps=40, warmup_steps=6)
    study_groups, megatron_groups = ScheduledGroups(0.0, 0.0), ScheduledGroups(0.0, 0.0)
    study = FunctionSchedule(study_groups, lambda t: lr_at(t, scale))
    megatron = OptimizerParamScheduler(
        megatron_groups, init_lr=0.0, max_lr=scale.lr, min_lr=scale.min_lr,
        lr_warmup_steps=scale.warmup_steps, lr_decay_steps=scale.steps,
        lr_decay_style="cosine", start_wd=0.0, end_wd=0.0, wd_incr_steps=scale.steps,
        wd_incr_style="constant",
    )  # fmt: skip
    ours, theirs = [], []
    for _ in range(scale.steps):
        study.step(1)
        megatron.step(1)
        ours.append(study_groups.param_groups[0]["lr"])
        theirs.append(megatron_groups.param_groups[0]["lr"])
    w = scale.warmup_steps
    assert ours[:w] == pytest.approx(theirs[:w], rel=1e-12)
    assert ours[w] == pytest.approx(scale.lr) and ours[w + 1 :] == pytest.approx(theirs[w:-1])
    assert theirs[-1] == pytest.approx(scale.min_lr) and ours[-1] > theirs[-1]


def test_completed_run_needs_final_record_and_same_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"event": "header", "fingerprint": "abc"}) + "\n")
    assert completed_run(path, "abc") is None  # no final record: unfinished
    with open(path, "a") as f:
        f.write(json.dumps({"event": "final", "final_val_loss": 1.0}) + "\n")
    assert completed_run(path, "abc") == {"event": "final", "final_val_loss": 1.0}
    assert completed_run(path, "other") is None


def test_divergence_needs_a_sustained_excursion_not_one_spike() -> None:
    from pipelines.studies.quality_run import DivergenceRule

    rule = DivergenceRule(vocab_size=1024, patience=20)  # level: log(1024) + 1 = 7.93
    assert not rule.diverged(6.16) and not rule.diverged(8.20)  # the spike that once ended a run
    assert not any(rule.diverged(6.0) for _ in range(100))
    assert [rule.diverged(9.0) for _ in range(20)] == [False] * 19 + [True]
    assert rule.spike_steps == 21
    assert DivergenceRule(1024).diverged(float("nan"))


def _tiny_model(seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 40), nn.LayerNorm(40), nn.GELU(), nn.Linear(40, 8))


def _batches(step: int, world_size: int):
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen))
            for _ in range(world_size)]  # fmt: skip


def _mse(model, batch):
    x, y = batch
    return (model(x) - y).square().mean()


def test_every_variant_resumes_from_a_checkpoint_bit_for_bit(compose_study, tmp_path) -> None:
    """The study's variants (one per simulator class, method and set of attribute types:
    dense, SCAPE, SCAPE's sign update, each kind of reading) trained 13 steps straight, and
    trained 7, checkpointed through a file, rebuilt from scratch and resumed for 6: the same
    parameters and losses to the bit. A simulator attribute the checkpoint missed fails here."""
    import torch

    from pipelines.studies.quality_run import build_simulator
    from scape.adams import AdamHParams
    from scape.simulate import load_simulator_state, simulator_state

    cfg = compose_study()
    hp = AdamHParams(lr=1e-2, weight_decay=0.1, clip_grad=0.5)
    W = 4
    seen = set()
    for name, variant in cfg.variants.items():
        if "ramp_fraction" in variant.options:  # a run's length fixes the ramp: 6 steps of 40
            scale = replace(cfg.scale, steps=40)
            variant = RunSpec(cfg.scale.models[0], name, variant, 0, scale, "d").variant
        straight = build_simulator(_tiny_model(), variant, W, hp)
        kind = (type(straight), variant.method,
                tuple(sorted((k, type(v)) for k, v in vars(straight).items())))  # fmt: skip
        if kind in seen:
            continue
        seen.add(kind)
        losses = [straight.step(_batches(t, W), _mse, lr=1e-2).loss for t in range(13)]
        cut = build_simulator(_tiny_model(), variant, W, hp)
        for t in range(7):
            cut.step(_batches(t, W), _mse, lr=1e-2)
        path = tmp_path / f"{name}.ckpt"
        torch.save({"model": cut.model.state_dict(), "simulator": simulator_state(cut)}, path)
        state = torch.load(path, weights_only=True)
        resumed = build_simulator(_tiny_model(seed=1), variant, W, hp)  # other weights: loaded
        resumed.model.load_state_dict(state["model"])
        load_simulator_state(resumed, state["simulator"])
        after = [resumed.step(_batches(t, W), _mse, lr=1e-2).loss for t in range(7, 13)]
        assert after == losses[7:], name
        for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
            assert torch.equal(a, b), name
    assert len(seen) >= 8  # dense x2, SCAPE x2, four reading simulators


def test_a_missing_test_split_is_named_with_its_fix() -> None:
    from pipelines.studies.quality_data import StudyData
    from pipelines.training.data import TrainingData

    data = StudyData(TrainingData(train=None, validation=[], world_size=1, batch_per_rank=1), 8)
    assert data.validation_batches(None, 4) == []  # an empty validation split: no batches
    with pytest.raises(ValueError, match="no test split; prepare it with a non-zero"):
        data.validation_batches(None, 4, split="test")
