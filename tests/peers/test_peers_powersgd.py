"""CountedPowerSGD: torch's PowerSGD hook in DDP on 2 gloo ranks, its bytes and checkpoints."""

import pytest
import torch
from peers_common import FakeBucket, digest, split, weights_only_round_trip

from scape.comm import GRAD_VALUES, ring_bytes_per_rank
from scape.peers import CountedPowerSGD, PowerSGDConfig

CFG = PowerSGDConfig(rank=2, start_iter=2)
STEPS, MORE = 5, 2


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def _train(rank, model, hook, steps, seed):
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=hook.state.process_group)
    ddp.register_comm_hook(hook, CountedPowerSGD.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed + rank)
    digests, bytes_ = [], []
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(8, 64, generator=gen)).square().mean().backward()
        opt.step()
        digests.append(digest(model.parameters()))
        bytes_.append(hook.counter.snapshot().get(GRAD_VALUES, 0.0))
    return digests, bytes_


def _fake_steps(hook, params, rank, steps):
    """Drive the hook with one fake bucket per step; results per parameter."""
    out = []
    for step in steps:
        gen = torch.Generator().manual_seed(900 + 10 * step + rank)
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        res = hook.hook(hook, FakeBucket(0, params, grads)).wait().clone()
        out.append(digest(split(res, params)))
    return out


def _suite(rank, world_size, group):
    model = _model()
    hook = CountedPowerSGD(CFG, group, params=model.parameters())
    digests, bytes_ = _train(rank, model, hook, STEPS, seed=0)
    state = weights_only_round_trip(hook.state_dict())
    # A resumed run: fresh model and DDP (registration-order buckets again), loaded hook.
    resumed_model = _model()
    resumed_model.load_state_dict(model.state_dict())
    resumed = CountedPowerSGD(CFG, group, params=resumed_model.parameters())
    resumed.load_state_dict(state)
    resumed_digests, _ = _train(rank, resumed_model, resumed, MORE, seed=100)
    # Exact continuation when the layout is unchanged (fake buckets, fixed order).
    params = [torch.zeros(4, 16), torch.zeros(16), torch.zeros(8, 12)]
    a = CountedPowerSGD(PowerSGDConfig(rank=1), group, params=params)
    first = _fake_steps(a, params, rank, range(4))
    b = CountedPowerSGD(PowerSGDConfig(rank=1), group, params=params)
    b.load_state_dict(weights_only_round_trip(a.state_dict()))
    return {
        "digests": digests,
        "bytes": bytes_,
        "iter": hook.state.iter,
        "resumed": (resumed_digests, resumed.state.iter, state["layouts"], resumed._layouts),
        "fake": (
            first,
            _fake_steps(a, params, rank, range(4, 6)),
            _fake_steps(b, params, rank, range(4, 6)),
        ),
    }


@pytest.fixture(scope="module")
def two(ranks):
    return [r["test_peers_powersgd"] for r in ranks[:2]]


def _analytic_numel(shapes, rank, min_rate):
    """Elements torch's powerSGD_hook all-reduces per step: (n + m) r per compressed matrix."""
    total = 0
    for shape in shapes:
        n, m = shape[0], torch.Size(shape[1:]).numel()
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return total


def test_bytes_match_the_analytic_count(two):
    shapes = [tuple(p.shape) for p in _model().parameters()]
    dense = 2 * ring_bytes_per_rank(4 * sum(torch.Size(s).numel() for s in shapes), 2)
    compressed = 2 * ring_bytes_per_rank(4 * _analytic_numel(shapes, CFG.rank, 2.0), 2)
    want = [
        dense * min(s, CFG.start_iter) + compressed * max(0, s - CFG.start_iter)
        for s in range(1, STEPS + 1)
    ]
    assert two[0]["bytes"] == pytest.approx(want)
    assert compressed < dense / 20  # the 256x64 and 256x256 weights dominate
    assert two[0]["iter"] == STEPS


def test_params_identical_across_ranks(two):
    assert two[0]["digests"] == two[1]["digests"] and len(set(two[0]["digests"])) == STEPS
    assert two[0]["resumed"][0] == two[1]["resumed"][0]


def test_resume_continues_and_drops_memories_of_another_layout(two):
    digests, iters, saved, now = two[0]["resumed"]
    assert iters == STEPS + MORE and len(set(digests)) == MORE
    # Saved for DDP's rebuilt (reversed) bucket; the fresh DDP's first bucket was in
    # registration order, so its memories were dropped, then the rebuilt one came back.
    assert [k for k, _ in saved[0]] == [5, 4, 3, 2, 1, 0]
    assert [k for k, _ in now[0]] == [5, 4, 3, 2, 1, 0]


def test_state_dict_round_trip_continues_identically(two):
    for r in two:
        _, original, restored = r["fake"]
        assert original == restored


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="start_iter"):
        PowerSGDConfig(start_iter=1)
    with pytest.raises(ValueError, match="rank"):
        PowerSGDConfig(rank=0)
    PowerSGDConfig(start_iter=0, use_error_feedback=False, warm_start=False)  # torch allows it
