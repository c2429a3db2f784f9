"""The study-only readings of the abstract: each checked against a reference it must equal
(the library's R0 step, RMSprop, AdamS) and against its own invariants (conservation of
gradient mass, the owner's mask, bounded staleness, skipped non-finite steps)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipelines.studies.readings import (
    ChunkBasis,
    LocalMomentSimulator,
    ReadingConfig,
    build_reading_simulator,
)
from scape.adams import AdamHParams, adams_update_
from scape.basis import dct_matrix
from scape.comm import GRAD_VALUES, MASKS, PARAM_VALUES
from scape.simulate import Simulator

W = 3
HP = AdamHParams(lr=1e-2, weight_decay=0.1, clip_grad=1.0)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 40), nn.GELU(), nn.Linear(40, 3))


def _loss(model: nn.Module, batch) -> torch.Tensor:
    return (model(batch[0]) - batch[1]).square().mean()


def _batches(t: int, scale: float = 1.0) -> list:
    g = torch.Generator().manual_seed(t)
    return [
        (torch.randn(4, 6, generator=g) * scale, torch.randn(4, 3, generator=g)) for _ in range(W)
    ]


def _params(sim: Simulator) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in sim.params])


def test_dct_basis_is_orthonormal_and_invertible() -> None:
    d = dct_matrix(16)
    assert torch.allclose(d @ d.T, torch.eye(16), atol=1e-6)
    x = torch.randn(2, 5 * 16)
    for kind in ("dct", "identity"):
        basis = ChunkBasis(kind, 16)
        assert basis.forward(x).shape == (2, 5, 16)
        assert torch.allclose(basis.inverse(basis.forward(x)), x, atol=1e-5)


def test_owner_reading_sending_everything_is_dense_adams() -> None:
    """R0 with the whole shard on the mask (density 1) is dense AdamS, clipping included:
    the owner code's masked AdamS and the optimizer's dense rule are the same arithmetic."""
    adams = Simulator(_model(), W, method="adams", hparams=HP)
    r0 = build_reading_simulator(
        _model(), W, HP,
        ReadingConfig(reading="owner", basis="identity", chunk=0, k=0, density=1.0),
    )  # fmt: skip
    for t in range(12):
        a, b = adams.step(_batches(t), _loss), r0.step(_batches(t), _loss)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    n = sum(p.numel() for p in adams.params)
    assert torch.allclose(_params(r0)[:n], _params(adams), atol=1e-5)


def test_local_reading_sending_everything_is_its_dense_limit() -> None:
    """k = C: every rank's moment is sent and emptied each step, so q is the mean gradient
    and R6-rms is RMSprop (Adam with beta1 = 0), R6 with AdamS on q is dense AdamS."""
    dense = {"reading": "local", "basis": "dct", "chunk": 8, "k": 8, "local_beta": 0.999}
    hp = AdamHParams(lr=1e-2, weight_decay=0.1, clip_grad=0.0)  # the local readings do not clip
    adams = Simulator(_model(), W, method="adams", hparams=hp)
    r6adams = build_reading_simulator(_model(), W, hp, ReadingConfig(**dense, update="adams"))
    r6rms = build_reading_simulator(_model(), W, hp, ReadingConfig(**dense, update="rms"))
    ref = _model()
    decay = [p.ndim >= 2 for p in ref.parameters()]
    rmsprop = torch.optim.Adam(
        [{"params": [p for p, d in zip(ref.parameters(), decay, strict=True) if d], "weight_decay": 0.1},
         {"params": [p for p, d in zip(ref.parameters(), decay, strict=True) if not d], "weight_decay": 0.0}],
        lr=HP.lr, betas=(0.0, 0.95), eps=HP.eps,
    )  # fmt: skip
    for t in range(10):
        adams.step(_batches(t), _loss)
        r6adams.step(_batches(t), _loss)
        r6rms.step(_batches(t), _loss)
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for batch in _batches(t):
            ref.zero_grad()
            _loss(ref, batch).backward()
            grads = [g + p.grad / W for g, p in zip(grads, ref.parameters(), strict=True)]
        for p, g in zip(ref.parameters(), grads, strict=True):
            p.grad = g
        with torch.no_grad():  # decoupled decay first, as the readings do
            for p, d in zip(ref.parameters(), decay, strict=True):
                if d:
                    p.mul_(1 - HP.lr * HP.weight_decay)
        for group in rmsprop.param_groups:
            group["weight_decay"] = 0.0
        rmsprop.step()
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert torch.allclose(_params(r6adams)[: ref_flat.numel()], _params(adams), atol=1e-5)
    assert torch.allclose(_params(r6rms)[: ref_flat.numel()], ref_flat, atol=1e-5)


def test_adams_per_coefficient_is_adams_in_the_identity_basis_and_not_in_the_dct() -> None:
    """AdamS kept per coefficient of the chunked basis: with the identity basis it is the
    same arithmetic as AdamS on q; in the DCT its nonlinear denominator makes it another
    rule (the map is orthonormal, AdamS's per-entry normalization is not invariant to it)."""
    dense = {"reading": "local", "chunk": 8, "k": 8, "local_beta": 1.0}
    hp = AdamHParams(lr=1e-2, weight_decay=0.1, clip_grad=0.0)
    sims = {
        (basis, update): build_reading_simulator(
            _model(), W, hp, ReadingConfig(**dense, basis=basis, update=update))
        for basis in ("identity", "dct") for update in ("adams", "adams_coef")
    }  # fmt: skip
    for t in range(6):
        for sim in sims.values():
            sim.step(_batches(t), _loss)
    p = {key: _params(sim) for key, sim in sims.items()}
    assert torch.allclose(p["identity", "adams_coef"], p["identity", "adams"], atol=1e-6)
    assert torch.allclose(p["dct", "adams"], p["identity", "adams"], atol=1e-5)
    assert not torch.allclose(p["dct", "adams_coef"], p["dct", "adams"], atol=1e-4)


def test_unknown_update_is_named_with_the_choices() -> None:
    with pytest.raises(
        ValueError, match="update='adamz': use one of sign, rms, adam, adams, adams_coef"
    ):
        ReadingConfig(update="adamz")


def test_dgc_sending_everything_is_dense_adams_and_counts_its_indices() -> None:
    """The DGC peer at density 1 without momentum correction is dense AdamS (clipping
    included); at 1% every rank's values and int32 indices are all-gathered."""
    adams = Simulator(_model(), W, method="adams", hparams=HP)
    full = ReadingConfig(reading="dgc", basis="identity", chunk=0, k=0, density=1.0,
                         momentum_correction=0.0, dense_warmup_steps=0)  # fmt: skip
    dgc = build_reading_simulator(_model(), W, HP, full)
    for t in range(8):
        a, b = adams.step(_batches(t), _loss), dgc.step(_batches(t), _loss)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    n = sum(p.numel() for p in adams.params)
    assert torch.allclose(_params(dgc)[:n], _params(adams), atol=1e-5)
    sparse = build_reading_simulator(
        _model(), W, HP, ReadingConfig(reading="dgc", basis="identity", chunk=0, k=0,
                                       density=0.01, dense_warmup_steps=0))  # fmt: skip
    res = sparse.step(_batches(0), _loss)
    per_rank_values = sparse.n_chunks * sparse.k  # one top-k per shard
    expected = W * per_rank_values * 4 * (W - 1) / W
    assert res.bytes[GRAD_VALUES] == expected == res.bytes[MASKS]
    assert res.bytes[PARAM_VALUES] == 0.0
    assert sparse.k == 2  # ceil(0.01 * 135): 403 parameters in 3 shards of 135


def test_dgc_sends_each_ranks_top_k_keeps_the_rest_and_steps_adams_on_the_mean() -> None:
    """Per rank and shard the k largest |accumulated| entries are sent and emptied, the
    others kept (error feedback); every rank applies AdamS to the mean of what was sent."""
    hp = AdamHParams(lr=1e-2, weight_decay=0.0, clip_grad=0.0)
    cfg = ReadingConfig(reading="dgc", basis="identity", chunk=0, k=0, density=0.05,
                        momentum_correction=0.0, dense_warmup_steps=0)  # fmt: skip
    sim = build_reading_simulator(_model(), W, hp, cfg)
    for t in range(4):
        grads, _ = sim.worker_grads(_batches(t), _loss)
        acc = sim.v + sim._flat_grads(grads)  # (W, total)
        param, m = sim.flat_param.clone(), sim.m.clone()
        sim.step(_batches(t), _loss)
        per_shard = acc.abs().view(W, sim.n_chunks, -1)
        kth = per_shard.topk(sim.k, dim=-1).values[..., -1:]
        sent = (per_shard >= kth).view(W, -1)
        assert int(sent.sum()) == W * sim.n_chunks * sim.k
        assert torch.equal(sim.v, torch.where(sent, 0.0, acc))
        adams_update_(param, m, (acc * sent).mean(0), step=t + 1, lr=hp.lr,
                      beta1=hp.betas[0], beta2=hp.betas[1], eps=hp.eps)  # fmt: skip
        assert torch.allclose(sim.flat_param, param, atol=1e-6)


def test_local_moments_conserve_gradient_mass_and_share_the_owners_mask() -> None:
    """With local_beta = 1 nothing is lost: W * sum of q + the ranks' moments = every
    gradient produced. Every chunk's mask is the top-k of its owner's own coefficients."""
    cfg = ReadingConfig(reading="local", chunk=8, k=1, local_beta=1.0, update="sign",
                        dense_warmup_steps=0, delay_mask=False)  # fmt: skip
    sim = build_reading_simulator(_model(), W, HP, cfg)
    assert isinstance(sim, LocalMomentSimulator)
    produced = torch.zeros(sim.layout.total)
    sent = torch.zeros(sim.layout.total)
    original_apply = sim._apply

    def record(q: torch.Tensor, lr: float) -> None:
        sent.add_(q, alpha=W)
        original_apply(q, lr)

    sim._apply = record  # type: ignore[method-assign]
    for t in range(8):
        grads, _ = sim.worker_grads(_batches(t), _loss)
        produced += sim._flat_grads(grads).sum(0)
        before = sim.local_m.clone() + sim._flat_grads(grads)
        sim._scape_step(grads, 0.0, HP.lr)
        coefs = sim.basis.forward(before)
        owner_rows = coefs[sim.owner_of_chunk, torch.arange(sim.n_chunks)]
        expected = owner_rows.abs().topk(1, dim=-1).indices
        assert torch.equal(sim.mask_idx.sort(-1).values, expected.sort(-1).values)
    assert torch.allclose(sent + sim.local_m.sum(0), produced, atol=1e-4)


def test_stale_replicas_match_the_owner_where_sent_and_stay_bounded() -> None:
    cfg = ReadingConfig(reading="stale", basis="identity", chunk=0, k=0, density=0.25,
                        age_weight=0.5)  # fmt: skip
    sim = build_reading_simulator(_model(), W, HP, cfg)
    for t in range(30):
        sim.step(_batches(t), _loss)
        owner = sim._owner_view()
        S = sim.layout.total // W
        for w in range(W):
            assert torch.equal(sim.replicas[w, w * S : (w + 1) * S], owner[w * S : (w + 1) * S])
    assert 0 < sim.max_staleness < 30  # the age term forces every entry out eventually
    assert sim.replica_gap < 0.5


@pytest.mark.parametrize("reading", ["local", "owner", "stale"])
def test_a_non_finite_gradient_changes_nothing(reading: str) -> None:
    opts = {"basis": "identity", "chunk": 0, "k": 0} if reading == "stale" else {}
    sim = build_reading_simulator(_model(), W, HP, ReadingConfig(reading=reading, **opts))
    for t in range(3):
        sim.step(_batches(t), _loss)
    before = _params(sim).clone()
    bad = _batches(9)
    bad[1] = (bad[1][0] * float("inf"), bad[1][1])
    assert sim.step(bad, _loss).skipped
    assert torch.equal(_params(sim), before)


def test_bad_options_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="reading='nope'"):
        ReadingConfig(reading="nope")
    with pytest.raises(ValueError, match="update='x'"):
        ReadingConfig(update="x")


def test_library_step_is_the_study_reading_r6_rms() -> None:
    """The library's SCAPE step and the study's R6-rms reading are one algorithm: with chunks
    that tile every shard and the same first mask, they agree to rounding for 10 steps. (The
    reading picks its first mask from the emptied moment, i.e. arbitrarily; the library from
    the first step's gradients. That and the tail chunk are their only differences; and the
    library clips q by Megatron's clip_grad rule where the readings clip nothing, so both run
    unclipped here.)"""
    import dataclasses

    from scape.config import ScapeConfig

    hp = dataclasses.replace(HP, clip_grad=0.0)
    lib = Simulator(_model(), W, method="scape", hparams=hp, scape=ScapeConfig(chunk=9, k=2))
    study = build_reading_simulator(
        _model(), W, hp, ReadingConfig(reading="local", chunk=9, k=2, update="rms")
    )
    assert lib.layout.shard_size(0) % 9 == 0
    for t in range(10):
        lib.step(_batches(t), _loss, lr=hp.lr)
        study.step(_batches(t), _loss, lr=hp.lr)
        if t == 0:  # hand the study the library's first mask, as (chunks, k) offsets
            study.mask_idx = lib.masks[0].reshape(-1, 2).clone()
        assert torch.allclose(_params(lib), _params(study)[: _params(lib).numel()], atol=1e-5)
