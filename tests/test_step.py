"""The fused (Triton) step agrees with the blocked (CPU) step to fp32 rounding.

On a machine without CUDA the kernels run under Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before anything imports Triton); on a GPU they are compiled. Each case is
one bucket of W shards, every part of a step on the same inputs through both
implementations: the payload (values and flag), the committed moments, params and second
moment after the update, the bf16 model params and the owner's next mask.
"""

from __future__ import annotations

import pytest
import torch

from scape.config import ScapeConfig
from scape.shard import decay_runs
from scape.step import Geometry, Update, make_bucket_step, resolve_implementation, step_clip

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # name: (shard size, W, config): tails, k > 1, odd chunks, a bf16 wire, the sign update
    "k1_tail": (1_037, 2, ScapeConfig(chunk=100, k=1)),
    "k10_bf16": (1_000, 3, ScapeConfig(chunk=100, k=10, value_dtype="bfloat16")),
    "chunk48_sign": (500, 2, ScapeConfig(chunk=48, k=3, update="sign", moment_beta=0.9)),
    "one_rank": (733, 1, ScapeConfig(chunk=64, k=5)),
}


def _state(size, world, seed):
    g = torch.Generator().manual_seed(seed)
    numel = size * world

    def rand(scale=1.0):
        return (torch.randn(numel, generator=g) * scale).to(DEVICE)

    decay = torch.zeros(numel, dtype=torch.bool)
    decay[numel // 5 : numel // 2] = True
    decay[numel * 3 // 4 :] = True
    return {
        "moment": rand(0.1),
        "grad": rand(),
        "param": rand(),
        "second_moment": rand().abs() * 0.01,
        "decay": decay_runs(decay),
    }


def _run(implementation, size, world, cfg, *, dense, masks, seed=0, clip=0.5):
    """Every part of one rank's step over one bucket; returns what it wrote."""
    s = _state(size, world, seed)
    geo = Geometry(size, world, cfg.chunk, cfg.k)
    rank = world - 1
    step = make_bucket_step(implementation, geo, rank, cfg, DEVICE, s["decay"], 1e-8)
    wire = torch.float32 if cfg.value_dtype == "float32" else torch.bfloat16
    if step.payload_is_grad(dense):  # the fused warm-up reduces the grad buffer in place
        payload = s["grad"]
    else:
        payload = torch.empty(step.payload_numel(dense), dtype=wire, device=DEVICE)
    next_mask = torch.empty(step.num_selected, dtype=torch.int64, device=DEVICE)
    step.pack(s["moment"], s["grad"], None if dense else masks, payload, next_mask=next_mask)
    sent = step.values(payload, dense).clone()
    # the "all-reduce": the other ranks' values as this rank's, scaled (same on both paths)
    synced = (sent.float() * world).to(wire)
    param_out = torch.empty(size * world, dtype=torch.bfloat16, device=DEVICE)
    update = Update(
        param=s["param"], second_moment=s["second_moment"] if cfg.update == "rms" else None,
        param_out=param_out, decay_factor=0.99, lr=0.01, step=3, clip=clip,
    )  # fmt: skip
    step.finish(s["moment"], s["grad"], None if dense else masks, synced, update=update,
                next_mask=next_mask)  # fmt: skip
    return {"payload": sent, "moment": s["moment"], "param": s["param"],
            "second_moment": s["second_moment"], "param_out": param_out, "next_mask": next_mask}  # fmt: skip


def _masks(size, world, cfg, seed=5):
    """Every shard's mask as its owner makes it (from a random moment)."""
    from scape.basis import ShardBasis

    basis = ShardBasis(size, cfg.chunk, cfg.k)
    g = torch.Generator().manual_seed(seed)
    return torch.stack([basis.select(torch.randn(size, generator=g)) for _ in range(world)]).to(
        DEVICE
    )


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_step_agrees_with_the_blocked_step(case, dense):
    size, world, cfg = CASES[case]
    masks = _masks(size, world, cfg)
    blocked = _run("blocked", size, world, cfg, dense=dense, masks=masks)
    fused = _run("fused", size, world, cfg, dense=dense, masks=masks)
    for name in ("payload", "moment", "param", "second_moment"):
        torch.testing.assert_close(fused[name].float(), blocked[name].float(), rtol=2e-6,
                                   atol=2e-6, msg=f"{case}: {name}")  # fmt: skip
    torch.testing.assert_close(fused["param_out"], blocked["param_out"], rtol=0.01, atol=0)
    assert torch.equal(fused["next_mask"], blocked["next_mask"]), case


def test_the_flag_marks_a_non_finite_candidate_even_off_the_mask():
    size, world, cfg = CASES["k1_tail"]
    masks = _masks(size, world, cfg)
    for implementation in ("blocked", "fused"):
        s = _state(size, world, 0)
        s["grad"][7] = float("inf")  # one entry, almost surely in no sent coefficient's chunk
        step = make_bucket_step(implementation, Geometry(size, world, cfg.chunk, cfg.k), 0,
                                cfg, DEVICE, [], 1e-8)  # fmt: skip
        payload = torch.empty(step.payload_numel(False), device=DEVICE)
        step.pack(s["moment"], s["grad"], masks, payload)
        assert payload[-1] == float("inf"), implementation
        s["grad"][7] = 0.0
        step.pack(s["moment"], s["grad"], masks, payload)
        assert payload[-1] == 0.0, implementation


def test_the_bf16_rounding_is_torchs():
    """The kernels round to bf16 by hand (Triton's interpreter truncates): ties to even, as
    torch's cast, including values at the halfway point and overflow to inf."""
    size, world, cfg = 1_000, 1, ScapeConfig(chunk=100, k=100, value_dtype="bfloat16")
    step = make_bucket_step("fused", Geometry(size, world, 100, 100), 0, cfg, DEVICE, [], 1e-8)
    one_ulp = 2.0**-7
    values = torch.tensor([1.0 + one_ulp / 2, 1.0 + 3 * one_ulp / 2, -(1.0 + one_ulp / 2), 3.4e38,
                           1e-3, -7.77])  # fmt: skip
    moment = torch.zeros(size, device=DEVICE)
    grad = torch.zeros(size, device=DEVICE)
    grad[: len(values)] = values.to(DEVICE)
    payload = torch.empty(step.payload_numel(True), dtype=torch.bfloat16, device=DEVICE)
    step.pack(moment, grad, None, payload)
    assert torch.equal(payload[: len(values)], values.to(DEVICE).to(torch.bfloat16))
    # what the wire rounded away stays in the grad buffer for the commit, exactly
    assert torch.equal(grad[: len(values)], values.to(DEVICE) - payload[: len(values)].float())


def test_the_fused_warm_up_reuses_the_grad_buffer():
    """fp32 wire: the payload is the grad itself, no flag; bf16: a payload without a flag."""
    step32 = make_bucket_step("fused", Geometry(100, 2, 100, 1), 0, ScapeConfig(), DEVICE, [], 0)
    bf16 = ScapeConfig(value_dtype="bfloat16")
    step16 = make_bucket_step("fused", Geometry(100, 2, 100, 1), 0, bf16, DEVICE, [], 0)
    assert step32.payload_is_grad(True) and not step32.payload_is_grad(False)
    assert not step16.payload_is_grad(True)
    assert step32.payload_numel(True) == step16.payload_numel(True) == 200
    assert step32.payload_numel(False) == 2 * 1 + 1


def test_step_clip_is_the_same_scalar_on_both_paths():
    g = torch.Generator().manual_seed(3)
    synced = [torch.randn(n, generator=g).to(DEVICE) for n in (101, 7, 1_000)]
    norm_b, clip_b = step_clip(synced, 1.0, "blocked")
    norm_f, clip_f = step_clip(synced, 1.0, "fused")
    assert float(norm_f) == pytest.approx(norm_b, rel=1e-12)
    assert float(clip_f) == pytest.approx(torch.tensor(clip_b).float().item(), rel=1e-7)
    _, no_clip = step_clip(synced, 1e9, "fused")
    assert float(no_clip) == 1.0
    assert step_clip(synced, 0.0, "fused")[1] is None


def test_the_implementation_is_chosen_by_device_and_checked():
    assert resolve_implementation(None, "cpu") == "blocked"
    with pytest.raises(ValueError, match="not one of"):
        resolve_implementation("triton", "cpu")
