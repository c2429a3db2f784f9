"""Invariants of the W-worker SCAPE simulator (the oracle for the distributed code)."""

import math

import pytest
import torch
from torch import nn

from scape.adams import AdamHParams
from scape.config import ScapeConfig
from scape.layout import FlatLayout
from scape.simulate import Simulator


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


HP = AdamHParams(lr=1e-2, weight_decay=0.1, clip_grad=0.0)


def run(sim, steps, lr=None):
    return [sim.step(batches_for(t, sim.world_size), mse, lr=lr) for t in range(steps)]


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_dense_path_is_rmsprop_on_the_mean_gradient():
    """Sending everything (the dense warm-up, here every step) makes q the mean gradient, and
    the rms update is Adam with beta1 = 0 (RMSprop with bias correction): a literal reference."""
    cfg = ScapeConfig(dense_warmup_steps=10**6)
    sim = Simulator(make_model(), 3, method="scape", hparams=HP, scape=cfg)
    ref = make_model()
    v = [torch.zeros_like(p) for p in ref.parameters()]
    for t in range(1, 13):
        sim.step(batches_for(t, 3), mse)
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for batch in batches_for(t, 3):
            ref.zero_grad()
            mse(ref, batch).backward()
            grads = [g + p.grad / 3 for g, p in zip(grads, ref.parameters(), strict=True)]
        with torch.no_grad():
            for p, g, vi in zip(ref.parameters(), grads, v, strict=True):
                if p.ndim >= 2:
                    p.mul_(1 - HP.lr * HP.weight_decay)
                vi.mul_(0.95).add_(0.05 * g * g)
                p.sub_(HP.lr * g / ((vi / (1 - 0.95**t)).sqrt() + HP.eps))
    assert torch.allclose(flat_params(sim.model), flat_params(ref), atol=1e-6)


def test_every_coefficient_through_the_dct_equals_the_dense_path():
    dense = Simulator(make_model(), 3, method="scape", hparams=HP,
                      scape=ScapeConfig(chunk=16, k=16, dense_warmup_steps=10**6))  # fmt: skip
    every = Simulator(
        make_model(), 3, method="scape", hparams=HP, scape=ScapeConfig(chunk=16, k=16)
    )
    for t in range(10):
        a, b = dense.step(batches_for(t, 3), mse), every.step(batches_for(t, 3), mse)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    assert torch.allclose(flat_params(dense.model), flat_params(every.model), atol=1e-5)


@pytest.mark.parametrize("value_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bucket_size", [None, 40])
def test_conservation_sent_plus_moments_equals_all_gradients(value_dtype, bucket_size):
    """moment_beta = 1: nothing decays, so W * (sum of every q) + every worker's moment is
    every gradient ever produced (with a bf16 wire too: the rounding stays in the moments)."""
    cfg = ScapeConfig(chunk=8, k=1, moment_beta=1.0, update="sign", value_dtype=value_dtype)
    model = make_model()
    n = sum(p.numel() for p in model.parameters())
    layout = FlatLayout.contiguous([p.numel() for p in model.parameters()], 3,
                                   bucket_size=bucket_size)  # fmt: skip
    sim = Simulator(model, 3, method="scape", hparams=AdamHParams(lr=0.0, clip_grad=0.0), scape=cfg,
                    layout=layout)  # fmt: skip
    produced = torch.zeros(sim.layout.total)
    sent = torch.zeros(sim.layout.total)
    for t in range(12):
        grads, loss = sim.worker_grads(batches_for(t, 3), mse)
        produced += sim._flat_grads(grads).sum(0)
        sim._scape_step(grads, loss, 0.0)
        sent += sim.last_q * 3
    assert n <= sim.layout.total
    error = (sent + sim.moment.sum(0) - produced).norm() / produced.norm()
    # fp32: rounding only. bf16: each rank's rounding stays in its moment, but the bf16 sum
    # of the W wires is rounded once more, an error no rank holds (about 2^-8 relative).
    assert error < (1e-6 if value_dtype == "float32" else 1e-2), error


def test_masks_are_delayed_by_one_step_and_made_by_each_shards_owner():
    cfg = ScapeConfig(chunk=8, k=2)
    sim = Simulator(make_model(), 3, method="scape", hparams=HP, scape=cfg)
    run(sim, 1)
    expected = None
    for t in range(1, 6):
        statistic = sim.moment.clone() if t > 1 else None
        made_before = [m.clone() for m in sim.masks]
        if statistic is not None:
            s = sim.layout.shard_size(0)
            expected = [sim.bases[0].select(statistic[j, j * s : (j + 1) * s]) for j in range(3)]
            assert all(torch.equal(made_before[0][j], expected[j]) for j in range(3))
        sim.step(batches_for(t, 3), mse)
        assert all(torch.equal(a, b) for a, b in zip(sim.last_used_masks, made_before, strict=True))


def test_sign_update_moves_every_entry_by_lr():
    cfg = ScapeConfig(chunk=8, k=1, update="sign")
    hp = AdamHParams(lr=1e-3, weight_decay=0.0, clip_grad=0.0)
    sim = Simulator(make_model(), 2, method="scape", hparams=hp, scape=cfg)
    run(sim, 2)
    before = flat_params(sim.model).clone()
    run(sim, 1)
    moved = (flat_params(sim.model) - before).abs()
    assert torch.allclose(moved[moved > 0], torch.full_like(moved[moved > 0], 1e-3), atol=1e-6)
    assert (moved > 0).float().mean() > 0.9  # a few coefficients per chunk move every entry


def test_non_finite_step_is_skipped_without_touching_state():
    sim = Simulator(make_model(), 3, method="scape", hparams=HP, scape=ScapeConfig(chunk=8, k=1))
    run(sim, 3)
    state, params = sim.state_dict(), flat_params(sim.model).clone()
    bad = batches_for(9, 3)
    bad[2] = (bad[2][0] * float("inf"), bad[2][1])
    result = sim.step(bad, mse)
    assert result.skipped and math.isnan(result.grad_norm)
    assert torch.equal(flat_params(sim.model), params)
    after = sim.state_dict()
    assert torch.equal(after["moment"], state["moment"]) and after["updates"] == state["updates"]
    assert all(torch.equal(a, b) for a, b in zip(after["masks"], state["masks"], strict=True))
    assert not sim.step(batches_for(10, 3), mse).skipped


def test_byte_counts_follow_the_ring_formulas():
    cfg = ScapeConfig(chunk=8, k=1)
    sim = Simulator(make_model(), 4, method="scape", hparams=HP, scape=cfg)
    results = run(sim, 3)
    total, n = sim.layout.total, sim.bases[0].num_selected
    ring = 3 / 4
    assert results[0].bytes["grad_values"] == ring * (total + 1) * 4  # dense warm-up
    assert results[1].bytes == {"grad_values": ring * (4 * n + 1) * 4,
                                "param_values": ring * (4 * n + 1) * 4,
                                "masks": ring * 4 * n, "scalars": 0.0}  # fmt: skip
    dense = Simulator(make_model(), 4, method="adams", hparams=HP)
    assert (
        results[1].bytes["grad_values"]
        < dense.step(batches_for(0, 4), mse).bytes["grad_values"] / 5
    )


def test_world_size_one_trains_and_loss_falls():
    hp = AdamHParams(lr=3e-3, clip_grad=0.0)
    sim = Simulator(make_model(), 1, method="scape", hparams=hp, scape=ScapeConfig(chunk=8, k=1))
    fixed = batches_for(0, 1)
    losses = [sim.step(fixed, mse).loss for _ in range(60)]
    assert losses[-1] < 0.7 * losses[0]


def test_rejects_unknown_method_and_bad_batch_count():
    with pytest.raises(ValueError, match="unknown method"):
        Simulator(make_model(), 2, method="sgd")
    sim = Simulator(make_model(), 2, method="scape", scape=ScapeConfig(chunk=8, k=1))
    with pytest.raises(ValueError, match="one batch per worker"):
        sim.step(batches_for(0, 3), mse)


def test_mask_overlap_compares_coefficients_chunk_by_chunk():
    """The same offsets in another chunk are other coefficients: swapping two chunks' masks
    keeps nothing of them."""
    from scape.basis import ShardBasis
    from scape.simulate import _overlap

    basis = ShardBasis(250, 100, 2)  # two chunks of 100 and a tail of 50, k = 2 each
    before = torch.tensor([[0, 1, 5, 6, 3, 4]])  # chunk 0: {0, 1}, chunk 1: {5, 6}, tail {3, 4}
    assert _overlap([basis], [before], [before.clone()]) == 1.0
    swapped = torch.tensor([[5, 6, 0, 1, 3, 4]])  # chunks 0 and 1 swap: only the tail is kept
    assert _overlap([basis], [before], [swapped]) == pytest.approx(2 / 6)
    one_kept = torch.tensor([[0, 7, 5, 6, 3, 9]])
    assert _overlap([basis], [before], [one_kept]) == pytest.approx(4 / 6)


def _ramped(implementation="blocked"):
    """A ramp from k=4 to 1 of 8 over 3 sparse steps after one dense step."""
    cfg = ScapeConfig(chunk=8, k=1, ramp_start_k=4, ramp_steps=3)
    return cfg, Simulator(make_model(), 4, method="scape", hparams=HP, scape=cfg,
                          implementation=implementation)  # fmt: skip


def test_a_density_ramp_sends_each_steps_k_and_masks_the_next_steps():
    """Step t packs k_at(t) coefficients per chunk with masks made a step earlier for k_at(t),
    books that many bytes, and lands on the constant k after the ramp."""
    from scape.basis import selected_count
    from scape.comm import step_bytes_per_rank

    cfg, sim = _ramped()
    assert [cfg.k_at(t) for t in range(1, 7)] == [4, 4, 3, 2, 1, 1]
    booked = []
    for t in range(1, 7):
        result, k = sim.step(batches_for(t, 4), mse), cfg.k_at(t)
        shards = [sim.layout.shard_size(b) for b in range(len(sim.layout.buckets))]
        counts = shards if t == 1 else [selected_count(s, 8, k) for s in shards]
        assert result.bytes == step_bytes_per_rank(counts, 4, 4, masks=t > 1), t
        nexts = [selected_count(s, 8, cfg.k_at(t + 1)) for s in shards]
        assert [m.shape[1] for m in sim.masks] == nexts, t
        booked.append(sum(result.bytes.values()))
    assert sim.run_bytes(6) == sum(booked)


def test_a_ramp_is_its_starting_sparsity_while_k_holds():
    """While the ramp's k has not moved, the run is the constant-k run bit for bit (a ramp
    over many steps holds k=4 for its first ones)."""
    ramp = ScapeConfig(chunk=8, k=1, ramp_start_k=4, ramp_steps=100)
    assert [ramp.k_at(t) for t in range(1, 7)] == [4] * 6
    sims = [Simulator(make_model(), 3, method="scape", hparams=HP, scape=cfg)
            for cfg in (ramp, ScapeConfig(chunk=8, k=4))]  # fmt: skip
    a, b = (run(sim, 6) for sim in sims)
    assert [r.loss for r in a] == [r.loss for r in b]
    assert torch.equal(flat_params(sims[0].model), flat_params(sims[1].model))


def test_the_fused_step_runs_a_ramp_as_the_blocked_step():
    """The GPU path (Triton's interpreter on CPU) through the ramp's changes of k."""
    pytest.importorskip("triton")
    (_, blocked), (_, fused) = _ramped("blocked"), _ramped("fused")
    a, b = run(blocked, 6), run(fused, 6)
    assert [r.bytes for r in a] == [r.bytes for r in b]
    torch.testing.assert_close(flat_params(fused.model), flat_params(blocked.model),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert all(torch.equal(x, y) for x, y in zip(blocked.masks, fused.masks, strict=True))
    # Past the ramp (k=1 from step 5) each step holds its send copy at k=1's size only.
    from scape.basis import selected_count

    for step in (s for worker in fused.steps for s in worker):
        assert step._sent.numel() == step.geo.world_size * selected_count(step.geo.shard_size, 8, 1)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"k": 1, "ramp_start_k": 1, "ramp_steps": 5}, r"ramp_start_k=1 must be in \(k=1"),
        ({"k": 1, "ramp_start_k": 4, "ramp_steps": 0}, "set both"),
        ({"k": 1, "ramp_steps": 5}, "set both"),
    ],
)
def test_a_bad_ramp_is_refused_with_the_fix(fields, match):
    with pytest.raises(ValueError, match=match):
        ScapeConfig(chunk=8, **fields)


def test_a_ramp_is_written_as_sparsities():
    cfg = ScapeConfig.from_settings({"sparsity": 0.99, "ramp_start_sparsity": 0.9,
                                     "ramp_steps": 225})  # fmt: skip
    assert (cfg.k, cfg.ramp_start_k, cfg.k_levels) == (1, 10, tuple(range(1, 11)))
    assert [cfg.k_at(t) for t in (1, 2, 115, 227, 1000)] == [10, 10, 3, 1, 1]
    with pytest.raises(ValueError, match="write ramp_start_sparsity"):
        ScapeConfig.from_settings({"ramp_start_k": 10, "ramp_steps": 5})


def test_a_share_of_the_run_is_whole_steps_at_least_one():
    from scape.config import ramp_steps_for

    assert [ramp_steps_for(0.15, n) for n in (300, 1500, 3000, 3, 1)] == [45, 225, 450, 1, 1]
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match=f"ramp_fraction={bad} must be in"):
            ramp_steps_for(bad, 100)


def test_a_ramp_resumes_mid_ramp_bit_for_bit():
    """Checkpointed at step 3 (k=3, its masks made for k=2), rebuilt and resumed: the same
    losses and params as straight through."""
    from scape.simulate import load_simulator_state, simulator_state

    _, straight = _ramped()
    losses = [r.loss for r in run(straight, 6)]
    _, cut = _ramped()
    first = [r.loss for r in run(cut, 3)]
    state = simulator_state(cut)
    _, resumed = _ramped()
    load_simulator_state(resumed, state)
    rest = [resumed.step(batches_for(t, 4), mse).loss for t in range(3, 6)]
    assert first + rest == losses
    assert torch.equal(flat_params(resumed.model), flat_params(straight.model))


def test_after_a_skipped_ramp_step_the_next_sends_at_its_masks_k():
    """A non-finite step mid-ramp changes nothing; the next step uses the masks the skipped
    one did not (made for the skipped step's k), and makes its own at the schedule's k."""
    from scape.basis import selected_count
    from scape.comm import step_bytes_per_rank

    cfg, sim = _ramped()
    for t in range(1, 3):
        sim.step(batches_for(t, 4), mse)
    poisoned = batches_for(3, 4)
    poisoned[1] = (poisoned[1][0] * float("nan"), poisoned[1][1])
    assert sim.step(poisoned, mse).skipped  # step 3, masks for k_at(3) = 3 kept
    result = sim.step(batches_for(4, 4), mse)  # step 4 sends at 3, makes masks at k_at(5)
    shards = [sim.layout.shard_size(b) for b in range(len(sim.layout.buckets))]
    counts = [selected_count(s, 8, cfg.k_at(3)) for s in shards]
    assert result.bytes == step_bytes_per_rank(counts, 4, 4, masks=True)
    assert [m.shape[1] for m in sim.masks] == [selected_count(s, 8, cfg.k_at(5)) for s in shards]
