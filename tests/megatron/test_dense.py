"""Dense baselines through stock Megatron-Core on 2 gloo ranks (tiny GPT and tiny Llama).

One spawned run does all the work (process start-up and the megatron import dominate the
cost); the tests below each check one property of its results.
"""

import hashlib
import sys

import pytest
import torch
import torch.distributed as dist

from scape.spawn import run_distributed

STEPS = 8
WORLD = 2
MCORE_RANDOM = "megatron.core.tensor_parallel.random"


def _skip_wandb() -> None:
    """megatron-core imports wandb (for its inference engine, ~1.5 s per process) when it can;
    these ranks never log, so make that import fail fast, as megatron allows."""
    sys.modules.setdefault("wandb", None)


def _param_digest(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def _batches(shape, rank: int, n: int = 4, batch: int = 2):
    """Per-rank data: 4 fixed batches cycled, so the loss must fall if training works."""
    g = torch.Generator().manual_seed(1000 + rank)
    data = torch.randint(0, shape.vocab_size, (n, batch, shape.seq_length + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def _reference_adams(shape, batches, spec, world_size):
    """Single-process AdamS on the rank-averaged gradient, with Megatron's weight-decay groups.

    Every rank runs it on its own batch and all-reduces the gradients (pre-scaled by 1/W,
    exactly as Megatron's DDP does before its reduce-scatter), so every rank holds the same
    reference trajectory.
    """
    from scape.adams import AdamS
    from scape.megatron.models import build_gpt_model
    from scape.megatron.train import forward_loss

    torch.manual_seed(0)
    _, model = build_gpt_model(shape)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim == 1 or name.endswith(".bias") else decay).append(p)
    opt = AdamS(
        [
            {"params": decay, "weight_decay": spec.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=spec.lr,
        betas=(spec.beta1, spec.beta2),
        eps=spec.eps,
        foreach=False,
    )
    losses, digests = [], []
    for step in range(STEPS):
        tokens, labels = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(model, tokens, labels)
        loss.backward()
        for p in model.parameters():
            p.grad.mul_(1.0 / world_size)
            dist.all_reduce(p.grad)
        opt.step()
        losses.append(loss.item())
        digests.append(_param_digest(model.parameters()))
    return losses, digests, [p.detach().clone() for p in model.parameters()]


# A function whose module is megatron's, as far as the CPU layer can tell (it keys on the
# caller's module name): what megatron's own call of each stand-in gets.
_MEGATRON_PROBE = """
def call(module, attr, *args):
    return getattr(importlib.import_module(module), attr)(*args)
"""


def _stand_in_call(module: str, attr: str, args: tuple, *, as_megatron: bool) -> str:
    """What one call gives: the stand-in's kind of answer, or the error of the original."""
    import importlib

    if as_megatron:
        scope = {"__name__": "megatron.core.scape_probe", "importlib": importlib}
        exec(compile(_MEGATRON_PROBE, "<megatron probe>", "exec"), scope)
        call = scope["call"]
    else:

        def call(module, attr, *args):
            return getattr(importlib.import_module(module), attr)(*args)

    queued = len(torch.cuda._queued_calls)
    try:
        result = call(module, attr, *args)
    except (AssertionError, RuntimeError):
        return "failed"
    if len(torch.cuda._queued_calls) > queued:
        return "queued a CUDA call"  # the original _set_cuda_rng_state: deferred, never run
    if isinstance(result, torch.Tensor):
        return f"tensor on {result.device.type}"
    return type(result).__name__


def _stand_in_observations() -> dict:
    """Every stand-in called from our code (the original) and from megatron's (the stand-in)."""
    from scape.megatron.cpu_compat import STAND_INS

    args = {"_set_cuda_rng_state": (torch.zeros(8, dtype=torch.uint8),)}
    return {
        f"{module}.{attr}": tuple(
            _stand_in_call(module, attr, args.get(attr, ()), as_megatron=m) for m in (False, True)
        )
        for module, attr, _ in STAND_INS
    }


def _compat_observations() -> dict:
    from megatron.core.transformer.utils import get_sliding_window_causal_mask

    from scape.megatron import cpu_compat

    out = {"installed": cpu_compat.is_cpu_compat_installed()}
    out["stand_ins"] = _stand_in_observations()
    out["reinstall"] = cpu_compat.install_cpu_compat()  # idempotent: still one mode
    out["modes"] = torch._C._len_torch_function_stack()
    # megatron's own device="cuda" allocations land on the CPU ...
    out["megatron_mask_device"] = str(get_sliding_window_causal_mask(4, 4, (2, 0)).device)
    # ... but ours still fail, as they must on a machine without a GPU.
    try:
        torch.zeros(1, device="cuda")
        out["our_cuda_alloc"] = "succeeded"
    except (AssertionError, RuntimeError):
        out["our_cuda_alloc"] = "failed"
    out["our_type_name"] = torch.zeros(1).type()
    # SCAPE's step runs outside the mode: there even megatron's calls are not mapped, and
    # the mode is back afterwards
    with cpu_compat.outside_megatron():
        try:
            get_sliding_window_causal_mask(4, 4, (2, 0))
            out["megatron_outside"] = "mapped"
        except (AssertionError, RuntimeError):
            out["megatron_outside"] = "failed"
    out["modes_after"] = torch._C._len_torch_function_stack()
    out["megatron_after"] = str(get_sliding_window_causal_mask(4, 4, (2, 0)).device)
    return out


def _version_observations() -> dict:
    """The installed release and which of the DDP options SCAPE refuses it defines."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from scape.megatron.versions import REFUSED_DDP_OPTIONS, megatron_core_version

    fields = DistributedDataParallelConfig.__dataclass_fields__
    return {
        "release": megatron_core_version(),
        "defines": {option: option in fields for option in REFUSED_DDP_OPTIONS},
    }


def _param_counts() -> dict:
    """Every registered shape built by megatron (the big ones on the meta device: no memory,
    no init cost) against the closed-form count."""
    from scape.megatron.models import SHAPES, build_gpt_model, count_params

    out = {}
    for name, shape in SHAPES.items():
        device = "cpu" if name.startswith("tiny") else "meta"
        with torch.device(device):
            _, model = build_gpt_model(shape, device=device)
        out[name] = (sum(p.numel() for p in model.parameters()), count_params(shape))
    return out


def _dense_runs(rank, world_size):
    _skip_wandb()
    from scape.megatron.dense import OptimizerSpec, build_dense_optimizer, init_megatron, wrap_ddp
    from scape.megatron.models import SHAPES, build_gpt_model
    from scape.megatron.train import train_step

    init_megatron(0)
    out = {"compat": _compat_observations(), "param_counts": _param_counts() if rank == 0 else {}}
    out["versions"] = _version_observations()
    for shape_name in ("tiny-gpt", "tiny-llama"):
        shape = SHAPES[shape_name]
        batches = _batches(shape, rank)
        for kind in ("adamw", "adams"):
            # clip_grad=0: Megatron's sharded norm rounds differently from a single-process
            # norm, which would make the reference comparison approximate for no good reason.
            spec = OptimizerSpec(kind=kind, lr=2e-3, weight_decay=0.1, clip_grad=0.0)
            torch.manual_seed(0)
            config, model = build_gpt_model(shape)
            ddp = wrap_ddp(config, model, bucket_size=20_000)  # several buckets
            opt = build_dense_optimizer(ddp, spec)
            losses, digests = [], []
            for step in range(STEPS):
                result = train_step(ddp, opt, batches[step % len(batches)])
                assert result.updated
                losses.append(result.loss)
                digests.append(_param_digest(model.parameters()))
            run = {
                "losses": losses,
                "digests": digests,
                "inner": type(opt.chained_optimizers[0].optimizer).__name__,
                "buckets": sum(len(b.buckets) for b in ddp.buffers),
            }
            if kind == "adams":
                ref_losses, ref_digests, ref_params = _reference_adams(
                    shape, batches, spec, world_size
                )
                run["ref_losses"] = ref_losses
                run["ref_digests"] = ref_digests
                run["ref_max_abs_diff"] = max(
                    (a.detach() - b).abs().max().item()
                    for a, b in zip(model.parameters(), ref_params, strict=True)
                )
            out[(shape_name, kind)] = run
    return out


@pytest.fixture(scope="module")
def results():
    return run_distributed(_dense_runs, WORLD, timeout_s=300)


CASES = [(s, k) for s in ("tiny-gpt", "tiny-llama") for k in ("adamw", "adams")]


def test_compat_layer_active_idempotent_and_scoped_to_megatron(results):
    """On whichever megatron-core is installed (make test: 0.16.1, make test-mcore-latest:
    0.19.2): megatron's CUDA calls work on the CPU, ours still fail."""
    if torch.cuda.is_available():
        pytest.skip("the CPU compatibility layer is inactive with CUDA")
    for r in results:
        assert r["compat"] == {
            "installed": True,
            "reinstall": True,
            "modes": 1,
            "megatron_mask_device": "cpu",
            "our_cuda_alloc": "failed",
            "our_type_name": "torch.FloatTensor",
            "megatron_outside": "failed",
            "modes_after": 1,
            "megatron_after": "cpu",
            # (called from our code, called from megatron's): each stand-in acts for megatron
            # only; ours get the original, which fails (or only queues) on a CPU-only build
            "stand_ins": {
                "torch.cuda.current_device": ("failed", "int"),
                "torch.cuda.current_stream": ("failed", "_InertStream"),
                "torch.cuda.get_rng_state": ("failed", "tensor on cpu"),
                "torch.cuda.synchronize": ("failed", "NoneType"),
                f"{MCORE_RANDOM}._get_cuda_rng_state": ("failed", "tensor on cpu"),
                f"{MCORE_RANDOM}._set_cuda_rng_state": ("queued a CUDA call", "NoneType"),
            },
        }


def test_megatron_builds_every_shape_with_the_closed_form_param_count(results):
    counts = results[0]["param_counts"]
    assert {"tiny-gpt", "tiny-llama", "gpt-345m", "llama-500m", "llama-1.8b"} <= set(counts)
    for name, (built, formula) in counts.items():
        assert built == formula, name


def test_runs_through_megatron_with_several_buckets(results):
    for case in CASES:
        assert results[0][case]["buckets"] > 1  # the multi-bucket path is exercised
    assert results[0][("tiny-gpt", "adamw")]["inner"] == "AdamW"
    assert results[0][("tiny-gpt", "adams")]["inner"] == "AdamS"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_loss_decreases(results, case):
    for rank_result in results:
        losses = rank_result[case]["losses"]
        assert sum(losses[-4:]) < sum(losses[:4]) - 0.1, losses


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_params_bit_identical_across_ranks(results, case):
    assert results[0][case]["digests"] == results[1][case]["digests"]


@pytest.mark.parametrize("shape", ["tiny-gpt", "tiny-llama"])
def test_megatron_adams_equals_single_process_adams(results, shape):
    """Megatron ZeRO-1 AdamS over 2 ranks == one AdamS on the averaged gradient, bit for bit.

    Exact because with W=2 the pre-scaled sum ``g0/2 + g1/2`` is the same float operation in
    the reduce-scatter and in the reference all-reduce, and AdamS is elementwise.
    """
    for rank_result in results:
        run = rank_result[(shape, "adams")]
        assert run["losses"] == run["ref_losses"]
        assert run["ref_max_abs_diff"] == 0.0
        assert run["digests"] == run["ref_digests"]


def test_installed_release_is_tested_and_defines_the_refused_options_it_should(results):
    """Whichever release runs (make test: 0.16.1, make test-mcore-latest: 0.19.2) is a tested
    one, and every DDP option SCAPE refuses exists under that name from the release
    versions.py says introduced it: a rename in a new release fails here, not silently."""
    from scape.megatron.versions import REFUSED_DDP_OPTIONS, TESTED_VERSIONS

    seen = results[0]["versions"]
    assert seen["release"] in TESTED_VERSIONS
    release = tuple(int(x) for x in seen["release"].split(".")[:2])
    for option, since in REFUSED_DDP_OPTIONS.items():
        expected = release >= tuple(int(x) for x in since.split("."))
        assert seen["defines"][option] == expected, (option, seen["release"])
