"""1-bit Adam: the sign codec, the compressed all-reduce on 2 and 3 ranks, the optimizer."""

import math

import pytest
import torch
from peers_common import FakeBucket, digest, weights_only_round_trip

from scape.comm import GRAD_VALUES, SCALARS, ByteCounter, ring_bytes_per_rank
from scape.peers import OneBitAdam, OneBitConfig, OneBitHook
from scape.peers.onebit import (
    compressed_allreduce,
    pack_signs,
    padded_numel,
    sign_compress,
    sign_decompress,
    unpack_signs,
)

N, CALLS, FREEZE, STEPS = 1001, 40, 3, 6  # N is not a multiple of 8W: padding is exercised


# ----------------------------------------------------------------------------- codec
def test_pack_unpack_round_trip_with_zeros():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    x[::7] = 0.0
    x[3] = -0.0
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.shape == (8,)
    assert torch.equal(unpack_signs(packed, 64), torch.where(x >= 0, 1.0, -1.0))
    assert torch.equal(unpack_signs(packed, 61), torch.where(x >= 0, 1.0, -1.0)[:61])
    assert pack_signs(torch.tensor([1.0] + [-1.0] * 7)).item() == 128  # first entry, top bit
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_signs(torch.ones(12))


def test_sign_compress_error_compensation():
    gen = torch.Generator().manual_seed(1)
    x, e_old = torch.randn(256, generator=gen), 0.1 * torch.randn(256, generator=gen)
    a = x + e_old
    packed, scale = sign_compress(a)
    assert scale.dtype == torch.float32 and scale.shape == ()
    torch.testing.assert_close(scale, a.norm() / math.sqrt(256))
    d = sign_decompress(packed, scale, 256)
    assert torch.equal(d.abs(), scale.expand(256)) and torch.equal(d >= 0, a >= 0)
    e_new = a - d
    # x + e_old == decompressed + e_new up to the rounding of one subtraction (an ulp of the
    # larger of |a| and the scale): not exact in floating point when |a| << scale.
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(d + e_new, a, rtol=eps, atol=float(eps * scale))


# ----------------------------------------------------------------------------- all-reduce
def _allreduce_runs(rank, world_size, group=None):
    x = torch.randn(N, generator=torch.Generator().manual_seed(rank)) * (1 + rank)
    n_pad = padded_numel(N, world_size)
    worker, server = torch.zeros(n_pad), torch.zeros(n_pad // world_size)
    counter = ByteCounter()
    outs = [compressed_allreduce(x, worker, server, group, counter).clone() for _ in range(CALLS)]
    return x, outs, counter.snapshot()


def _check_allreduce(per_rank):
    W = len(per_rank)
    for r in per_rank[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r[1], per_rank[0][1], strict=True))
    mean = sum(r[0] for r in per_rank) / W
    outs = per_rank[0][1]

    def drift(calls):  # relative distance of the running sum from calls * mean
        return float((sum(outs[:calls]) - calls * mean).norm() / (calls * mean).norm())

    # One call is crude (signs and one scale per chunk); error compensation resends what was
    # lost, the errors stay bounded, so the running sum's relative drift falls like 1/calls
    # (measured: 0.76, 0.16, 0.086, 0.025 after 1, 20, 40, 160 calls at W=2).
    assert drift(1) > 0.5
    assert drift(CALLS) < 0.1 and drift(CALLS) < 0.7 * drift(CALLS // 2)
    n_pad = padded_numel(N, W)
    want = {
        GRAD_VALUES: CALLS * 2 * ring_bytes_per_rank(n_pad // 8, W),
        SCALARS: CALLS * 2 * ring_bytes_per_rank(4 * W, W),
    }
    assert per_rank[0][2] == pytest.approx(want)
    # About 2 (W-1)/W * n/8 bytes of signs per call (n padded to whole bytes of W chunks).
    assert per_rank[0][2][GRAD_VALUES] / CALLS == pytest.approx(2 * (W - 1) / W * N / 8, rel=0.02)


def test_compressed_allreduce_two_ranks(ranks):
    _check_allreduce([r["test_peers_onebit"]["allreduce"] for r in ranks[:2]])


def test_compressed_allreduce_three_ranks(ranks):
    _check_allreduce([r["allreduce3"] for r in ranks])


# ----------------------------------------------------------------------------- optimizer
def _grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def _groups(params):
    return [
        {"params": params[:1], "lr": 1e-2, "weight_decay": 0.1},
        {"params": params[1:], "lr": 3e-3, "weight_decay": 0.0},
    ]


def test_before_freeze_it_is_adamw():
    gen = torch.Generator().manual_seed(0)
    ours = [torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen)]
    ref = [p.clone() for p in ours]
    hook = OneBitHook(OneBitConfig(freeze_step=10))
    kwargs = {"betas": (0.9, 0.95), "eps": 1e-8}
    opt, ref_opt = (
        OneBitAdam(_groups(ours), hook, **kwargs),
        torch.optim.AdamW(_groups(ref), **kwargs),
    )
    for step in range(3):
        for p, q, g in zip(ours, ref, _grads(ours, step), strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        for o in (opt, ref_opt):  # a scheduler's per-step change must be honoured
            o.param_groups[0]["lr"] = 1e-2 / (step + 1)
        opt.step()
        ref_opt.step()
        for p, q in zip(ours, ref, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert hook.step == 3


def test_after_freeze_variance_is_frozen_and_grad_is_the_momentum():
    p = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    hook = OneBitHook(OneBitConfig(freeze_step=2))
    lr, wd, beta2, eps = 1e-2, 0.1, 0.95, 1e-8
    opt = OneBitAdam([p], hook, lr=lr, betas=(0.9, beta2), eps=eps, weight_decay=wd)
    for step in range(2):
        p.grad = _grads([p], step)[0]
        opt.step()
    v = opt.state[p]["exp_avg_sq"].clone()
    # The optimizer checkpoints through torch's machinery (the hook's state separately).
    copy = OneBitAdam(
        [p.clone()], OneBitHook(OneBitConfig(freeze_step=2)), lr=lr, betas=(0.9, beta2)
    )
    copy.load_state_dict(weights_only_round_trip(opt.state_dict()))
    assert torch.equal(next(iter(copy.state.values()))["exp_avg_sq"], v)
    assert copy.param_groups[0]["weight_decay"] == wd
    for step in range(2, 4):
        before, m = p.clone(), _grads([p], step)[0]
        p.grad = m.clone()
        opt.step()
        want = before * (1 - lr * wd) - lr * m / (v.sqrt() / math.sqrt(1 - beta2**2) + eps)
        torch.testing.assert_close(p, want, rtol=0, atol=1e-7)
        assert torch.equal(opt.state[p]["exp_avg_sq"], v) and opt.state[p]["step"] == 2
    assert hook.step == 4


@pytest.mark.parametrize("mask_unseen", [True, False])
def test_entries_never_seen_in_the_warmup_do_not_move_after_the_freeze(mask_unseen):
    """A row with no gradient before the freeze has variance 0: its +-scale momentum would
    move it by lr * scale / eps. Masked (the default), it does not move."""
    p = torch.ones(2, 4)
    hook = OneBitHook(OneBitConfig(freeze_step=1))
    opt = OneBitAdam([p], hook, lr=1e-3, eps=1e-8, mask_unseen=mask_unseen)
    p.grad = torch.tensor([[0.5, -0.5, 0.25, 1.0], [0.0, 0.0, 0.0, 0.0]])  # row 1 unseen
    opt.step()
    row1 = p[1].clone()
    p.grad = torch.full((2, 4), 0.3)  # after the freeze: the (decompressed) momentum
    opt.step()
    moved = (p[1] - row1).abs().max().item()
    if mask_unseen:
        assert moved == 0.0
    else:
        assert moved > 1e3  # lr * 0.3 / eps
    assert (p[0] != 1.0).all()


def test_optimizer_and_config_reject_bad_values():
    p = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="beta1"):
        OneBitAdam([p], OneBitHook(OneBitConfig(beta1=0.8)), betas=(0.9, 0.95))
    with pytest.raises(ValueError, match="freeze_step"):
        OneBitConfig(freeze_step=0)
    with pytest.raises(ValueError, match="beta1"):
        OneBitConfig(beta1=1.0)


# ----------------------------------------------------------------------------- DDP
def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def _train(rank, onebit, group):
    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1}
    hook = None
    if onebit:
        hook = OneBitHook(OneBitConfig(freeze_step=FREEZE), group, params=model.parameters())
        ddp.register_comm_hook(hook, OneBitHook.hook)
        opt = OneBitAdam(model.parameters(), hook, **kwargs)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    gen = torch.Generator().manual_seed(rank)
    params, bytes_ = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        ddp(torch.randn(5, 16, generator=gen)).square().mean().backward()
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
        bytes_.append(hook.counter.snapshot() if hook else None)
    return model, params, bytes_, hook


def _resume(rank, model, hook):
    """The hook and one restored from its checkpoint take the same next step."""
    state = weights_only_round_trip(hook.state_dict())
    restored = OneBitHook(
        OneBitConfig(freeze_step=FREEZE), hook.process_group, params=model.parameters()
    )
    restored.load_state_dict(state)
    params = list(model.parameters())
    order = state["errors"][0]["keys"]  # the layout DDP's rebuilt bucket had
    gen = torch.Generator().manual_seed(50 + rank)
    grads = [torch.randn(p.shape, generator=gen) for p in params]
    outs = []
    for h in (hook, restored):
        bucket = FakeBucket(0, [params[i] for i in order], [grads[i] for i in order])
        outs.append(h.hook(h, bucket).wait().clone())
    return state, outs


def _suite(rank, world_size, group):
    model, params, bytes_, hook = _train(rank, onebit=True, group=group)
    _, dense, _, _ = _train(rank, onebit=False, group=group)
    return {
        "allreduce": _allreduce_runs(rank, world_size, group),
        "digests": [digest(ps) for ps in params],
        "params": params,
        "dense": dense,
        "bytes": bytes_,
        "hook_step": hook.step,
        "resume": _resume(rank, model, hook),
    }


def test_ddp_params_bit_identical_through_the_freeze(ranks):
    r0, r1 = (r["test_peers_onebit"] for r in ranks[:2])
    assert r0["digests"] == r1["digests"] and len(set(r0["digests"])) == STEPS
    assert r0["hook_step"] == STEPS


def test_ddp_before_freeze_matches_dense_adamw(ranks):
    r0 = ranks[0]["test_peers_onebit"]
    for ours, dense in zip(r0["params"][:FREEZE], r0["dense"][:FREEZE], strict=True):
        for p, q in zip(ours, dense, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    # After the freeze the update differs: 1-bit momentum, frozen variance.
    last = zip(r0["params"][-1], r0["dense"][-1], strict=True)
    assert any(not torch.equal(p, q) for p, q in last)


def test_ddp_bytes_switch_to_one_bit_at_the_freeze(ranks):
    bytes_ = ranks[0]["test_peers_onebit"]["bytes"]
    n = sum(p.numel() for p in _model().parameters())
    dense = 2 * ring_bytes_per_rank(4 * n, 2)
    assert bytes_[FREEZE - 1] == {GRAD_VALUES: FREEZE * dense}
    step = {k: bytes_[FREEZE][k] - bytes_[FREEZE - 1].get(k, 0.0) for k in bytes_[FREEZE]}
    n_pad = padded_numel(n, 2)
    assert step == {
        GRAD_VALUES: 2 * ring_bytes_per_rank(n_pad // 8, 2),
        SCALARS: 2 * ring_bytes_per_rank(8, 2),
    }


def test_hook_checkpoint_round_trip_continues_identically(ranks):
    for r in ranks[:2]:
        state, (original, restored) = r["test_peers_onebit"]["resume"]
        assert state["step"] == STEPS and len(state["momentum"]["params"]) == 4
        assert torch.equal(original, restored)
