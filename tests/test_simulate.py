"""Invariants of the W-worker SCAPE simulator (the oracle for the distributed code)."""

import copy

import pytest
import torch
from torch import nn

from scape.config import ScapeConfig
from scape.layout import FlatLayout
from scape.masks import num_selected
from scape.simulate import OptimizerHParams, Simulator


def make_model(seed=0, hidden=13):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Linear(hidden, 3)
    )


def mse(model, batch):
    x, y = batch
    return (model(x) - y).square().mean()


def batches_for(step, world_size, seed=123):
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    return [
        (torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen))
        for _ in range(world_size)
    ]


HP = OptimizerHParams(lr=1e-2, weight_decay=0.1)


def run(sim, steps, lr=None):
    return [sim.step(batches_for(t, sim.world_size), mse, lr=lr) for t in range(steps)]


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_density_one_equals_dense_adams_bit_for_bit(world_size):
    dense = Simulator(make_model(), world_size, method="adams", hparams=HP)
    sparse = Simulator(
        make_model(), world_size, method="scape", hparams=HP, scape=ScapeConfig(density=1.0)
    )
    for t in range(15):
        a = dense.step(batches_for(t, world_size), mse)
        b = sparse.step(batches_for(t, world_size), mse)
        assert a.loss == b.loss, f"step {t}"
    for p, q in zip(dense.model.parameters(), sparse.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_density_one_with_clipping_matches_dense_within_rounding():
    # The global norm is summed in a different order (per owner shard vs per param), so
    # the clip coefficient can differ in the last bit; params then agree to ~1e-6.
    hp = OptimizerHParams(lr=1e-2, weight_decay=0.1, max_grad_norm=0.05)
    dense = Simulator(make_model(), 2, method="adams", hparams=hp)
    sparse = Simulator(make_model(), 2, method="scape", hparams=hp, scape=ScapeConfig(density=1.0))
    run(dense, 10)
    run(sparse, 10)
    for p, q in zip(dense.model.parameters(), sparse.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _fresh_grad_sum(sim, batches):
    """All workers' gradients for this step, from an independent copy of the model."""
    twin = copy.deepcopy(sim.model)
    total = torch.zeros(sim.layout.total)
    for batch in batches:
        twin.zero_grad()
        mse(twin, batch).backward()
        for p, off in zip(twin.parameters(), sim.layout.param_offsets, strict=True):
            total[off : off + p.numel()] += p.grad.view(-1)
    return total


@pytest.mark.parametrize("value_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("statistic", ["momentum", "momentum_residual", "raw_gradient"])
def test_conservation_sent_plus_residuals_equals_all_gradients(value_dtype, statistic):
    W = 3
    sim = Simulator(
        make_model(),
        W,
        method="scape",
        hparams=HP,
        scape=ScapeConfig(
            density=0.1, statistic=statistic, value_dtype=value_dtype, error_feedback=True
        ),
    )
    produced = torch.zeros(sim.layout.total, dtype=torch.float64)
    sent = torch.zeros(sim.layout.total, dtype=torch.float64)
    for t in range(12):
        batches = batches_for(t, W)
        produced += _fresh_grad_sum(sim, batches).double()
        sim.step(batches, mse)
        sent += sim.last_sent.double()
    residuals = sim.residual.double().sum(0)
    assert residuals.abs().sum() > 0, "at 90% sparsity something must remain unsent"
    torch.testing.assert_close(sent + residuals, produced, rtol=0, atol=2e-5)


def test_mask_used_at_step_t_is_the_one_computed_at_end_of_step_t_minus_1():
    sim = Simulator(
        make_model(),
        2,
        method="scape",
        hparams=HP,
        scape=ScapeConfig(density=0.2, dense_warmup_steps=2),
    )
    for t in range(8):
        pending = copy.deepcopy(sim.masks)
        sim.step(batches_for(t, 2), mse)
        if t < 2:
            assert sim.last_used_masks[0][0].numel() == sim.layout.shard_size(0)  # dense warm-up
        else:
            for used, made in zip(sim.last_used_masks, pending, strict=True):
                for a, b in zip(used, made, strict=True):
                    assert torch.equal(a, b)
        if t + 1 >= 2:  # from the last warm-up step on, each step ends with the next mask made
            assert sim.masks is not None


def test_uneven_shards_and_k_rounding():
    model = make_model(hidden=5)  # 6*5+5+5+5+5*3+3 = 63 params: not divisible by W=4
    n = sum(p.numel() for p in model.parameters())
    assert n % 4
    layout = FlatLayout.contiguous([p.numel() for p in model.parameters()], 4, bucket_size=30)
    sim = Simulator(
        model, 4, method="scape", hparams=HP, scape=ScapeConfig(density=0.07), layout=layout
    )
    run(sim, 4)
    for b, masks in enumerate(sim.last_used_masks):
        k = num_selected(layout.shard_size(b), 0.07)
        assert all(m.numel() == k for m in masks)
        assert all(int(m.max()) < layout.shard_size(b) for m in masks)


def test_world_size_one_trains_and_loss_falls():
    sim = Simulator(
        make_model(),
        1,
        method="scape",
        hparams=OptimizerHParams(lr=3e-3),
        scape=ScapeConfig(density=0.1),
    )
    fixed = batches_for(0, 1)
    losses = [sim.step(fixed, mse).loss for _ in range(60)]
    assert losses[-1] < 0.7 * losses[0]


def test_without_error_feedback_nothing_is_kept():
    sim = Simulator(
        make_model(),
        2,
        method="scape",
        hparams=HP,
        scape=ScapeConfig(density=0.1, error_feedback=False),
    )
    run(sim, 5)
    assert sim.residual.abs().sum() == 0


def test_non_finite_step_is_skipped_without_touching_state():
    sim = Simulator(make_model(), 2, method="scape", hparams=HP, scape=ScapeConfig(density=0.1))
    run(sim, 4)
    before = [
        copy.deepcopy(x) for x in (sim.flat_param, sim.exp_avg, sim.residual, sim.masks, sim.age)
    ]
    bad = batches_for(99, 2)
    bad[1] = (bad[1][0] * float("inf"), bad[1][1])
    result = sim.step(bad, mse)
    assert result.skipped
    after = (sim.flat_param, sim.exp_avg, sim.residual, sim.masks, sim.age)
    for x, y in zip(before[:3] + before[4:], after[:3] + after[4:], strict=True):
        assert torch.equal(x, y)
    assert all(
        torch.equal(a, b)
        for ma, mb in zip(before[3], after[3], strict=True)
        for a, b in zip(ma, mb, strict=True)
    )


def test_byte_counts_follow_the_ring_formulas():
    W, density = 4, 0.1
    sim = Simulator(
        make_model(),
        W,
        method="scape",
        hparams=HP,
        scape=ScapeConfig(density=density, mask_encoding="int32"),
    )
    results = run(sim, 3)
    s = sim.layout.shard_size(0)
    k = num_selected(s, density)
    ring = (W - 1) / W
    assert results[0].bytes["masks"] == 0  # dense warm-up step
    assert results[2].bytes["grad_values"] == ring * W * k * 4
    assert results[2].bytes["param_values"] == ring * W * k * 4
    assert results[2].bytes["masks"] == ring * W * 4 * k
    assert results[2].bytes["scalars"] == 2 * ring * 8  # the float64 norm scalar


def test_rejects_unknown_method_and_bad_batch_count():
    with pytest.raises(ValueError, match="unknown method"):
        Simulator(make_model(), 2, method="sgd")
    sim = Simulator(make_model(), 2, method="scape")
    with pytest.raises(ValueError, match="one batch per worker"):
        sim.step(batches_for(0, 3), mse)


def test_conservation_holds_with_several_buckets():
    """Each bucket commits only its own slice of the fresh gradient (a past bug added it per bucket)."""
    W = 2
    model = make_model()
    layout = FlatLayout.contiguous([p.numel() for p in model.parameters()], W, bucket_size=40)
    assert len(layout.buckets) > 2
    sim = Simulator(
        model,
        W,
        method="scape",
        hparams=HP,
        scape=ScapeConfig(density=0.1, error_feedback=True),
        layout=layout,
    )
    produced = torch.zeros(layout.total, dtype=torch.float64)
    sent = torch.zeros(layout.total, dtype=torch.float64)
    for t in range(8):
        batches = batches_for(t, W)
        produced += _fresh_grad_sum(sim, batches).double()
        sim.step(batches, mse)
        sent += sim.last_sent.double()
    torch.testing.assert_close(sent + sim.residual.double().sum(0), produced, rtol=0, atol=2e-5)


def test_non_finite_entry_off_the_mask_also_skips():
    """A NaN in an unsent entry would stay in the residual forever; the step is skipped."""
    sim = Simulator(make_model(), 2, method="scape", hparams=HP, scape=ScapeConfig(density=0.01))
    run(sim, 3)
    residual = sim.residual.clone()

    def nan_in_one_weight(model, batch):
        loss = mse(model, batch)
        return loss + 0.0 * model[0].weight[0, 0] * float("nan") if batch is bad[1] else loss

    bad = batches_for(50, 2)
    assert sim.step(bad, nan_in_one_weight).skipped
    assert torch.equal(sim.residual, residual)


def test_skipped_last_warm_up_step_does_not_leave_the_next_step_without_masks():
    sim = Simulator(
        make_model(),
        2,
        method="scape",
        hparams=HP,
        scape=ScapeConfig(density=0.1, dense_warmup_steps=2),
    )
    run(sim, 1)
    bad = batches_for(9, 2)
    bad[0] = (bad[0][0] * float("inf"), bad[0][1])
    assert sim.step(bad, mse).skipped and sim.masks is None
    result = sim.step(batches_for(10, 2), mse)
    assert not result.skipped and sim.last_used_masks[0][0].numel() == num_selected(
        sim.layout.shard_size(0), 0.1
    )
