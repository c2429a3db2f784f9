"""The step's elementwise helpers: each is checked against the plain expression it replaces
(bit for bit where it promises the same bits)."""

import math

import pytest
import torch

from scape import shard
from scape.basis import ShardBasis, dct_matrix
from scape.shard import (
    all_finite,
    buffer_sq_norm,
    clip_coefficient,
    decay_runs,
    decode,
    rms_update_,
    runs_within,
    step_bucket_,
    weight_decay_,
)


def test_weight_decay_on_runs_equals_the_masked_multiply():
    torch.manual_seed(0)
    mask = torch.rand(10_000) < 0.5
    mask[:7] = True  # a run at the start and one at the end
    mask[-3:] = True
    runs = decay_runs(mask)
    assert all(bool(mask[a:b].all()) for a, b in runs)
    assert sum(b - a for a, b in runs) == int(mask.sum())
    p = torch.randn(10_000)
    expected = p.clone()
    expected[mask] *= 0.999
    weight_decay_(p, runs, 0.999)
    assert torch.equal(p, expected)
    assert decay_runs(torch.zeros(5, dtype=torch.bool)) == []


def test_all_finite():
    x = torch.randn(1000)
    assert bool(all_finite(x))
    for bad in (float("inf"), float("-inf"), float("nan")):
        y = x.clone()
        y[17] = bad
        assert not bool(all_finite(y))
    y = x.clone()
    y[3], y[4] = float("inf"), float("-inf")  # opposite infinities do not cancel
    assert not bool(all_finite(y))


def test_blocked_rms_update_is_bit_identical_to_the_whole_buffer(monkeypatch):
    torch.manual_seed(1)
    n = 10_007
    p, v, q = torch.randn(n), torch.rand(n), torch.randn(n)

    def reference(p, v, q, step, lr, beta, eps):
        v.mul_(beta).addcmul_(q, q, value=1.0 - beta)
        p.addcdiv_(q, torch.div(v, 1.0 - beta**step).sqrt_().add_(eps), value=-lr)

    p_ref, v_ref = p.clone(), v.clone()
    reference(p_ref, v_ref, q, 3, 1e-3, 0.95, 1e-8)
    monkeypatch.setattr(shard, "UPDATE_BLOCK", 1000)  # several blocks and a short last one
    rms_update_(p, v, q, step=3, lr=1e-3, beta=0.95, eps=1e-8)
    assert torch.equal(p, p_ref) and torch.equal(v, v_ref)


@pytest.mark.parametrize("clip", [None, 0.3])
@pytest.mark.parametrize("update", ["rms", "sign"])
@pytest.mark.parametrize("sparse", [True, False])
def test_fused_bucket_step_is_bit_identical_to_decoding_and_stepping_whole(
    update, sparse, clip, monkeypatch
):
    """step_bucket_ decodes and steps block by block (several blocks per shard here, and a
    tail chunk); the params and second moment equal decoding q whole, scaling it by the clip
    coefficient, a masked weight-decay multiply and the whole-buffer update, bit for bit; the
    buffer it was given is left as it was (in the warm-up q's blocks are the buffer)."""
    import scape.basis

    torch.manual_seed(5)
    W, size = 2, 1037
    basis = ShardBasis(size, 100, 2) if sparse else None
    moment = torch.randn(W, size)
    masks = torch.stack([basis.select(moment[w]) for w in range(W)]) if sparse else None
    synced = torch.randn(W * (basis.num_selected if sparse else size))
    decay = torch.ones(W * size, dtype=torch.bool)
    decay[300:420] = False  # an undecayed param across block boundaries
    p, v = torch.randn(W * size), torch.rand(W * size)
    synced_before = synced.clone()
    q = decode(basis, masks, synced, W)
    if clip is not None:
        q = q * clip
    p_ref, v_ref = p.clone(), v.clone()
    p_ref[decay] *= 0.99
    if update == "rms":
        rms_update_(p_ref, v_ref, q, step=3, lr=1e-3, beta=0.95, eps=1e-8)
    else:
        p_ref.add_(q.sign(), alpha=-1e-3)
    monkeypatch.setattr(scape.basis, "BLOCK_CHUNKS", 3)
    monkeypatch.setattr(shard, "UPDATE_BLOCK", 500)
    step_bucket_(p, v if update == "rms" else None, basis, masks, synced, world_size=W,
                 decay=decay_runs(decay), decay_factor=0.99, update=update, step=3,
                 lr=1e-3, beta=0.95, eps=1e-8, clip=clip)  # fmt: skip
    assert torch.equal(p, p_ref)
    if update == "rms":
        assert torch.equal(v, v_ref)
    assert torch.equal(synced, synced_before)


@pytest.mark.parametrize("sparse", [True, False])
def test_the_buffer_norm_is_the_norm_of_the_decoded_update(sparse):
    """Parseval: the clip's global norm is read off the summed buffer, with no decode; it is
    q's norm because every basis is orthonormal (a tail chunk included)."""
    torch.manual_seed(6)
    W, size = 3, 1037
    basis = ShardBasis(size, 100, 4) if sparse else None
    masks = torch.stack([basis.select(torch.randn(size)) for _ in range(W)]) if sparse else None
    synced = torch.randn(W * (basis.num_selected if sparse else size))
    q = decode(basis, masks, synced, W)
    assert math.isclose(buffer_sq_norm(synced), float(q.double().square().sum()), rel_tol=1e-5)
    assert math.isclose(buffer_sq_norm(synced.bfloat16()),
                        float(synced.bfloat16().double().square().sum()), rel_tol=1e-5)  # fmt: skip


def test_clip_coefficient_is_megatrons_rule():
    assert clip_coefficient(4.0, 1.0) == pytest.approx(1.0 / (4.0 + 1e-6))
    assert clip_coefficient(0.5, 1.0) is None  # below the threshold: untouched
    assert clip_coefficient(4.0, None) is None and clip_coefficient(4.0, 0.0) is None
    coeff = clip_coefficient(torch.tensor(2.0), 1.0)
    assert isinstance(coeff, torch.Tensor) and float(coeff) == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize("size", [1037, 1000])  # with and without a tail chunk
def test_synthesize_is_the_inverse_transform_of_the_sparse_coefficients(size):
    torch.manual_seed(3)
    basis = ShardBasis(size, 100, 3)
    x = torch.randn(2, size)
    masks = torch.stack([basis.select(x[i]) for i in range(2)])
    values = torch.randn(2, basis.num_selected)
    n_head = basis.full * basis.k
    head_idx = masks[:, :n_head].reshape(2, basis.full, basis.k)  # chunk-major (full, k)
    tail_idx = masks[:, n_head:]
    coefs = torch.zeros(2, basis.full, 100).scatter_(
        -1, head_idx, values[:, :n_head].reshape(head_idx.shape)
    )
    parts = [(coefs @ dct_matrix(100)).reshape(2, -1)]
    if basis.tail:
        tail = torch.zeros(2, basis.tail).scatter_(-1, tail_idx, values[:, n_head:])
        parts.append(tail @ dct_matrix(basis.tail))
    assert torch.allclose(basis.synthesize(values, masks), torch.cat(parts, -1), atol=1e-6)


def test_runs_within_equals_the_mask_restricted_to_the_range():
    torch.manual_seed(6)
    mask = torch.rand(2_000) < 0.5
    runs = decay_runs(mask)
    for lo, hi in [(0, 2_000), (0, 1), (333, 1_337), (1_999, 2_000), (700, 700)]:
        inside = torch.zeros(hi - lo, dtype=torch.bool)
        for a, b in runs_within(runs, lo, hi):
            assert 0 <= a < b <= hi - lo
            inside[a:b] = True
        assert torch.equal(inside, mask[lo:hi])
