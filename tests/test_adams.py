"""AdamS against an independent, literal transcription of the rule in the reference doc."""

import copy
import math

import pytest
import torch

from scape import AdamS
from scape.adams import adams_update_, adams_update_foreach_


def reference_adams(params, grads_per_step, groups):
    """Elementwise, in float64, written straight from the published rule (no shared code)."""
    state = {i: torch.zeros_like(p, dtype=torch.float64) for i, p in enumerate(params)}
    p64 = [p.detach().double().clone() for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            grp = groups[i]
            lr, (b1, b2), eps, wd = grp["lr"], grp["betas"], grp["eps"], grp["weight_decay"]
            g = g.double()
            p64[i] = p64[i] * (1 - lr * wd)
            m_hat = state[i] / (1 - b1**t)
            denom = torch.sqrt(b2 * m_hat**2 + (1 - b2) * g**2) + eps
            state[i] = b1 * state[i] + (1 - b1) * g
            p64[i] = p64[i] - lr * (state[i] / (1 - b1**t)) / denom
    return p64


@pytest.mark.parametrize("foreach", [False, True])
def test_matches_reference_over_many_steps_with_groups(foreach):
    gen = torch.Generator().manual_seed(0)
    params = [
        torch.randn(7, 5, generator=gen),
        torch.randn(11, generator=gen),
        torch.randn(3, 3, 3, generator=gen),
    ]
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    g1 = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    g2 = dict(lr=1e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0)
    opt = AdamS(
        [{"params": torch_params[:2], **g1}, {"params": torch_params[2:], **g2}], foreach=foreach
    )
    groups = [g1, g1, g2]
    grads_per_step = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(60)]
    for grads in grads_per_step:
        for p, g in zip(torch_params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
    expected = reference_adams(params, grads_per_step, groups)
    for got, want in zip(torch_params, expected, strict=True):
        torch.testing.assert_close(got.detach().double(), want, rtol=1e-5, atol=1e-6)


def test_first_step_is_scaled_sign():
    p = torch.nn.Parameter(torch.zeros(1000))
    p.grad = torch.randn(1000)
    AdamS([p], lr=1e-2, betas=(0.9, 0.95), eps=0.0).step()
    expected = -1e-2 * torch.sign(p.grad) / math.sqrt(1 - 0.95)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-7)


def test_foreach_is_bit_identical_to_single_tensor_loop():
    gen = torch.Generator().manual_seed(1)
    shapes = [(13,), (4, 9), (2, 3, 5)]
    ps = [torch.randn(s, generator=gen) for s in shapes]
    ms = [torch.randn(s, generator=gen) * 0.1 for s in shapes]
    gs = [torch.randn(s, generator=gen) for s in shapes]
    ps2, ms2 = copy.deepcopy(ps), copy.deepcopy(ms)
    kw = dict(step=7, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for p, m, g in zip(ps, ms, gs, strict=True):
        adams_update_(p, m, g, **kw)
    adams_update_foreach_(ps2, ms2, gs, **kw)
    for a, b in zip(ps + ms, ps2 + ms2, strict=True):
        assert torch.equal(a, b)


def test_masked_update_on_gathered_subset_equals_dense_on_those_entries():
    """The masked form SCAPE uses: decay all entries, update gathered ones with wd=0."""
    gen = torch.Generator().manual_seed(2)
    p, m, g = (torch.randn(100, generator=gen) for _ in range(3))
    idx = torch.tensor([3, 17, 18, 60, 99])
    dense_p, dense_m = p.clone(), m.clone()
    adams_update_(
        dense_p, dense_m, g, step=5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1
    )

    from scape.adams import apply_weight_decay_

    apply_weight_decay_(p, lr=1e-2, weight_decay=0.1)
    sub_p, sub_m = p[idx], m[idx]
    adams_update_(sub_p, sub_m, g[idx], step=5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    p[idx], m[idx] = sub_p, sub_m
    assert torch.equal(p[idx], dense_p[idx])
    assert torch.equal(m[idx], dense_m[idx])


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(3)
    model = torch.nn.Linear(8, 4)
    opt = AdamS(model.parameters(), lr=1e-2, weight_decay=0.1)
    data = [torch.randn(16, 8) for _ in range(6)]

    def train(m, o, batches):
        for x in batches:
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()

    train(model, opt, data[:3])
    clone = copy.deepcopy(model)
    opt2 = AdamS(clone.parameters(), lr=1e-2, weight_decay=0.1)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    train(model, opt, data[3:])
    train(clone, opt2, data[3:])
    for a, b in zip(model.parameters(), clone.parameters(), strict=True):
        assert torch.equal(a, b)
    assert set(opt.state_dict()["state"][0]) == {"step", "exp_avg"}


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(lr=-1.0), "learning rate"),
        (dict(betas=(1.0, 0.9)), "betas"),
        (dict(eps=-1.0), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
    ],
)
def test_rejects_bad_hyperparameters(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        AdamS([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_the_fused_kernel_agrees_with_the_single_tensor_rule():
    """scape.fused.adams_fused_ (Triton; the CPU interpreter without a GPU) against
    adams_update_, over steps with weight decay: the same numbers to fp32 rounding."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(5_001, generator=g).to(device)
    ref_p, ref_m = p0.clone(), torch.zeros_like(p0)
    fused_p, fused_m = p0.clone(), torch.zeros_like(p0)
    for step in range(1, 6):
        grad = torch.randn(5_001, generator=g).to(device)
        kw = dict(step=step, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
        adams_update_(ref_p, ref_m, grad, **kw)
        AdamS_fused_step(fused_p, fused_m, grad, **kw)
    torch.testing.assert_close(fused_m, ref_m, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fused_p, ref_p, rtol=1e-6, atol=1e-7)


def AdamS_fused_step(p, m, grad, **kw):
    """One step of the optimizer class with fused=True on one tensor."""
    step = kw.pop("step")
    param = torch.nn.Parameter(p)
    opt = AdamS([param], lr=kw["lr"], betas=(kw["beta1"], kw["beta2"]), eps=kw["eps"],
                weight_decay=kw["weight_decay"], fused=True)  # fmt: skip
    opt.state[param] = {"step": torch.tensor(float(step - 1)), "exp_avg": m}
    param.grad = grad
    opt.step()
    p.copy_(param.detach())


def test_fused_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.ones(3)
    with pytest.raises(ValueError, match="fused=True"):
        AdamS([param], fused=True).step()
    with pytest.raises(ValueError, match="exclusive"):
        AdamS([param], fused=True, foreach=True)
