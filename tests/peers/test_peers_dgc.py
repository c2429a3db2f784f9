"""DGC hook on 2 gloo ranks: the published rule, error feedback, bytes, checkpoints, DDP."""

import math

import pytest
import torch
import torch.distributed as dist
from peers_common import FakeBucket, digest, split, weights_only_round_trip

from scape.comm import GRAD_VALUES, MASKS, ring_bytes_per_rank
from scape.peers import DGCConfig, DGCHook
from scape.peers.dgc import accumulate_and_select_, num_selected

N, STEPS = 1000, 4
SHAPES = [(30, 20), (20,), (10, 30)]  # bucket 0 holds the first two, bucket 1 the third
LAYOUT = [[0, 1], [2]]
MOMENTUM_CFG = DGCConfig(density=0.1, momentum=0.9)
# Warm-up over 8 steps in 4 stages of 2: 25%, 6.25%, 1.5625%, then 0.39% < 1% gives the target.
WARMUP_CFG = DGCConfig(density=0.01, momentum=0.9, warmup_steps=8)


def _grad(rank, step, n=N):
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + rank))


def _param_grads(rank, step):
    gen = torch.Generator().manual_seed(7000 + 100 * step + rank)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _call(hook, index, params, grads, last=True):
    bucket = FakeBucket(index, params, grads, last=last)
    return hook.hook(hook, bucket).wait().clone()


def _run_steps(hook, params, rank, steps, layout=LAYOUT):
    """Per step, per bucket: the hook's result split back into per-parameter tensors."""
    out = []
    for step in steps:
        grads = _param_grads(rank, step)
        per_param = {}
        for b, members in enumerate(layout):
            ps = [params[i] for i in members]
            res = _call(hook, b, ps, [grads[i] for i in members], last=b == len(layout) - 1)
            per_param.update(zip(members, split(res, ps), strict=True))
        out.append([per_param[i] for i in range(len(params))])
    return out


def _suite(rank, world_size, group):
    out = {}
    flat = [torch.zeros(N)]
    # density 1 without momentum: a plain average all-reduce.
    h = DGCHook(DGCConfig(density=1.0, momentum=0.0), group)
    g = _grad(rank, 0)
    ref = g.clone()
    dist.all_reduce(ref, group=group)
    out["dense"] = (_call(h, 0, flat, [g]), ref / world_size, h.counter.snapshot())
    # Local clipping (the paper's): every entry sent, each rank's gradient clipped first.
    h = DGCHook(DGCConfig(density=1.0, momentum=0.0, local_clip=1.0), group, params=flat)
    out["local_clip"] = _call(h, 0, flat, [_grad(rank, 2)])
    # The paper's per-layer selection: each tensor of the bucket its own top 5%.
    two_params = [torch.zeros(s) for s in SHAPES[:2]]
    h = DGCHook(DGCConfig(density=0.05, momentum=0.0, per_tensor=True), group)
    out["per_tensor"] = (_call(h, 0, two_params, _param_grads(rank, 3)[:2]), h.counter.snapshot())
    # One step without momentum, each wire dtype: what was sent and what stayed behind.
    for dtype in ("float32", "bfloat16"):
        h = DGCHook(DGCConfig(density=0.05, momentum=0.0, value_dtype=dtype), group)
        g = _grad(rank, 1)
        bucket = FakeBucket(0, flat, [g])
        result = h.hook(h, bucket).wait().clone()
        residual = h.buffers.get(bucket)["v"].clone()
        out[dtype] = {"g": g, "residual": residual, "result": result, "bytes": h.counter.snapshot()}
    # Momentum correction over two buckets and several steps; then a checkpoint round trip.
    params = [torch.zeros(s) for s in SHAPES]
    h = DGCHook(MOMENTUM_CFG, group, params=params)
    out["momentum"] = _run_steps(h, params, rank, range(STEPS))
    out["momentum_bytes"] = h.counter.snapshot()
    restored = DGCHook(MOMENTUM_CFG, group, params=params)
    restored.load_state_dict(weights_only_round_trip(h.state_dict()))
    more = range(STEPS, STEPS + 2)
    out["resume"] = (_run_steps(h, params, rank, more), _run_steps(restored, params, rank, more))
    # DDP's rebuild permutes a bucket after the first step: the result must not change.
    fixed, moved = DGCHook(MOMENTUM_CFG, group), DGCHook(MOMENTUM_CFG, group)
    out["rebucket"] = (
        _run_steps(fixed, params, rank, range(3), layout=[[0, 1, 2]]),
        _run_steps(moved, params, rank, range(1), layout=[[0, 1, 2]])
        + _run_steps(moved, params, rank, range(1, 3), layout=[[2, 1, 0]]),
    )
    out["ddp"] = _ddp(rank, group)
    # The warm-up schedule: each step's bytes (both buckets), and the clock across a resume.
    h = DGCHook(WARMUP_CFG, group, params=params)
    per_step = []
    for step in range(WARMUP_CFG.warmup_steps + 2):
        before = h.counter.snapshot()
        _run_steps(h, params, rank, [step])
        per_step.append({k: v - before.get(k, 0.0) for k, v in h.counter.snapshot().items()})
    restored = DGCHook(WARMUP_CFG, group, params=params)
    restored.load_state_dict(weights_only_round_trip(h.state_dict()))
    old_format = DGCHook(WARMUP_CFG, group, params=params)
    old_format.load_state_dict({"buffers": h.state_dict()["buffers"]})
    out["warmup"] = (per_step, h.step, restored.step, old_format.step)
    return out


def _ddp(rank, group):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    hook = DGCHook(DGCConfig(density=0.3), group, params=model.parameters())
    ddp.register_comm_hook(hook, DGCHook.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    digests = []
    for _ in range(STEPS):
        opt.zero_grad()
        ddp(torch.randn(5, 8, generator=gen)).square().mean().backward()
        opt.step()
        digests.append(digest(model.parameters()))
    return digests, hook.counter.snapshot(), sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def two(ranks):
    return [r["test_peers_dgc"] for r in ranks[:2]]


def _bytes(n, density, value_size, steps=1, W=2):
    k = num_selected(n, density)
    return {
        GRAD_VALUES: steps * ring_bytes_per_rank(W * k * value_size, W),
        MASKS: steps * ring_bytes_per_rank(W * k * 4, W),
    }


def test_density_one_is_an_average_all_reduce(two):
    for result, ref, counted in (r["dense"] for r in two):
        torch.testing.assert_close(result, ref, rtol=1e-6, atol=1e-6)
        assert counted == _bytes(N, 1.0, 4)
    assert torch.equal(two[0]["dense"][0], two[1]["dense"][0])


def test_local_clipping_clips_each_ranks_gradient_to_its_share_before_accumulating(two):
    limit = 1.0 / math.sqrt(2)  # local_clip / sqrt(W), the one bucket holding every entry
    clipped = [
        g * min(1.0, limit / (float(g.norm()) + 1e-6)) for g in (_grad(r, 2) for r in (0, 1))
    ]
    assert float(_grad(0, 2).norm()) > 10 * limit  # so the clip acts
    for r in two:
        torch.testing.assert_close(r["local_clip"], (clipped[0] + clipped[1]) / 2)


def test_per_tensor_selection_takes_each_tensors_own_top_fraction(two):
    sent = []
    for r in range(2):
        parts = []
        for g in _param_grads(r, 3)[:2]:
            g = g.reshape(-1)
            idx = g.abs().topk(num_selected(g.numel(), 0.05)).indices
            parts.append(torch.zeros_like(g).index_put_((idx,), g[idx]))
        sent.append(torch.cat(parts))
    ks = [num_selected(torch.Size(s).numel(), 0.05) for s in SHAPES[:2]]
    for r in two:
        result, counted = r["per_tensor"]
        torch.testing.assert_close(result, (sent[0] + sent[1]) / 2)
        assert counted[MASKS] == ring_bytes_per_rank(2 * sum(ks) * 4, 2)
    # one top-k over the bucket would starve the 20-entry tensor; per tensor it gets its share
    assert int((sent[0][600:] != 0).sum()) == ks[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_error_feedback_conserves_the_gradient(two, dtype):
    k = num_selected(N, 0.05)
    sent = []
    for r in two:
        g, residual = r[dtype]["g"], r[dtype]["residual"]
        chosen = residual != g
        assert int(chosen.sum()) == k
        assert g[chosen].abs().min() >= g[~chosen].abs().max()  # exact top-k of |v|
        mine = torch.where(chosen, g - residual, 0.0)  # what this rank put on the wire
        wire = g[chosen].to(torch.bfloat16 if dtype == "bfloat16" else torch.float32).float()
        assert torch.equal(mine[chosen], wire)
        assert torch.equal(mine + residual, g)  # sent + residual == accumulated input
        sent.append(mine)
        assert r[dtype]["bytes"] == _bytes(N, 0.05, 2 if dtype == "bfloat16" else 4)
    expected = (sent[0] + sent[1]) / 2
    for r in two:
        assert torch.equal(r[dtype]["result"], expected)


def _reference(steps, world_size=2):
    """DGC for every rank in one process, straight from the description (fp32 wire)."""
    params = [torch.zeros(s) for s in SHAPES]
    u = [
        [torch.zeros(sum(params[i].numel() for i in m)) for m in LAYOUT] for _ in range(world_size)
    ]
    v = [[torch.zeros_like(t) for t in ranks] for ranks in u]
    out = []
    for step in steps:
        grads = [_param_grads(r, step) for r in range(world_size)]
        per_param = {}
        for b, members in enumerate(LAYOUT):
            total = torch.zeros_like(u[0][b])
            for r in range(world_size):
                g = torch.cat([grads[r][i].reshape(-1) for i in members])
                u[r][b] = MOMENTUM_CFG.momentum * u[r][b] + g
                v[r][b] = v[r][b] + u[r][b]
                idx = torch.topk(
                    v[r][b].abs(), num_selected(g.numel(), MOMENTUM_CFG.density)
                ).indices
                total[idx] += v[r][b][idx]
                v[r][b][idx] = 0.0
                u[r][b][idx] = 0.0
            ps = [params[i] for i in members]
            per_param.update(zip(members, split(total / world_size, ps), strict=True))
        out.append([per_param[i] for i in range(len(params))])
    return out


def test_momentum_correction_matches_the_reference(two):
    ref = _reference(range(STEPS))
    for r in two:
        for got_step, ref_step in zip(r["momentum"], ref, strict=True):
            for got, want in zip(got_step, ref_step, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for a, b in zip(two[0]["momentum"], two[1]["momentum"], strict=True):
        assert digest(a) == digest(b)  # bit-identical across ranks
    sizes = [sum(torch.Size(SHAPES[i]).numel() for i in m) for m in LAYOUT]
    want = {GRAD_VALUES: 0.0, MASKS: 0.0}
    for n in sizes:
        for kind, b in _bytes(n, 0.1, 4, steps=STEPS).items():
            want[kind] += b
    assert two[0]["momentum_bytes"] == want


def test_checkpoint_round_trip_continues_identically(two):
    for r in two:
        original, restored = r["resume"]
        assert [digest(s) for s in original] == [digest(s) for s in restored]


def test_state_follows_parameters_when_ddp_rebuckets(two):
    for r in two:
        fixed, moved = r["rebucket"]
        assert [digest(s) for s in fixed] == [digest(s) for s in moved]


def test_ddp_training_stays_identical_across_ranks(two):
    (d0, bytes0, n), (d1, _, _) = two[0]["ddp"], two[1]["ddp"]
    assert d0 == d1 and len(set(d0)) == STEPS  # identical, and the params did move
    assert bytes0 == _bytes(n, 0.3, 4, steps=STEPS)  # one bucket per step


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"density": 0.1, "momentum": 1.0}, "momentum"),
        ({"density": 0.1, "local_clip": -1.0}, "local_clip"),
        ({"density": 0.1, "value_dtype": "float16"}, "value_dtype"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DGCConfig(**kwargs)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_batched_rule_equals_the_hooks_per_bucket_rule_bit_for_bit(momentum):
    """The quality study's simulator calls the rule on (W, n_shards, n) at once, the hook on
    one (n,) bucket at a time: both must leave the same state and pick the same values."""
    W, shards, n, k, dtype = 3, 4, 50, 5, torch.bfloat16
    v, u = torch.zeros(W, shards, n), torch.zeros(W, shards, n) if momentum else None
    rows = [(torch.zeros(n), torch.zeros(n) if momentum else None) for _ in range(W * shards)]
    for step in range(3):
        grad = _grad(0, step, W * shards * n).view(W, shards, n)
        idx, wire = accumulate_and_select_(v, u, grad, momentum, k, dtype)
        for j, (v_row, u_row) in enumerate(rows):
            row_idx, row_wire = accumulate_and_select_(
                v_row, u_row, grad.view(-1, n)[j], momentum, k, dtype
            )
            got = idx.view(-1, k)[j]
            order, row_order = got.argsort(), row_idx.argsort()  # sorted=False: any order
            assert torch.equal(got[order], row_idx[row_order])
            assert torch.equal(wire.view(-1, k)[j][order], row_wire[row_order])
            assert torch.equal(v.view(-1, n)[j], v_row)
            if momentum:
                assert torch.equal(u.view(-1, n)[j], u_row)
                assert torch.equal(u.view(-1, n)[j][got], torch.zeros(k))


def test_warmup_density_schedule_decays_in_equal_stages_to_the_target():
    assert [WARMUP_CFG.density_at(t) for t in range(10)] == [
        0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.01, 0.01, 0.01, 0.01
    ]  # fmt: skip
    # Off by default: the constant density, whatever the step.
    assert all(MOMENTUM_CFG.density_at(t) == 0.1 for t in (0, 1, 10**6))
    # Never below the target: DGC-90's warm-up holds 25% for a quarter, then 10%.
    dgc90 = DGCConfig.for_sparsity(0.9, warmup_steps=100)
    assert [dgc90.density_at(t) for t in (0, 24, 25, 99, 100)] == [0.25, 0.25, 0.1, 0.1, 0.1]
    # Steps that do not divide into the stages: stage = step * 4 // warmup_steps.
    odd = DGCConfig(density=0.001, warmup_steps=5)
    assert [odd.density_at(t) for t in range(6)] == [
        0.25, 0.25, 0.0625, 0.015625, 0.00390625, 0.001
    ]  # fmt: skip
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="warmup_steps"):
            DGCConfig(density=0.01, warmup_steps=bad)
    with pytest.raises(ValueError, match="warmup_densities"):
        DGCConfig(density=0.01, warmup_steps=4, warmup_densities=(0.5, 0.0))


def test_warmup_bytes_follow_the_schedule_and_the_clock_survives_a_resume(two):
    sizes = [sum(torch.Size(SHAPES[i]).numel() for i in m) for m in LAYOUT]
    want = []
    for step in range(WARMUP_CFG.warmup_steps + 2):
        per_bucket = [_bytes(n, WARMUP_CFG.density_at(step), 4) for n in sizes]
        want.append({k: sum(b[k] for b in per_bucket) for k in (GRAD_VALUES, MASKS)})
    for r in two:
        per_step, step, restored, old_format = r["warmup"]
        assert per_step == want
        assert per_step[0][GRAD_VALUES] > per_step[2][GRAD_VALUES] > per_step[-1][GRAD_VALUES]
        assert step == restored == WARMUP_CFG.warmup_steps + 2  # one tick per step, not bucket
        assert old_format == 0  # a checkpoint from before the option starts the clock at 0
