"""Let megatron-core's GPTModel, DDP and DistributedOptimizer run on CPU/gloo.

Megatron-Core assumes CUDA in a handful of places (checked against 0.16.1):

* ``device="cuda"`` / ``device=torch.cuda.current_device()`` tensor creation:
  ``distributed/param_and_grad_buffer.py`` (buffer allocation, ~l.780-806),
  ``optimizer/optimizer.py`` (``found_inf``, ``_dummy_overflow_buf``, ``_scale_one``, l.473-485),
  ``optimizer/clip_grads.py`` (norm / clip scratch tensors, l.90-115, l.174, l.207),
  ``utils.py`` (``GlobalMemoryBuffer.get_tensor``, l.631), rotary embeddings
  (``rotary_pos_embedding.py`` l.162, l.297) and the default causal mask
  (``transformer/utils.py`` l.35-40, only when ``attention_mask=None``).
* type-name checks that demand ``torch.cuda.*Tensor``: ``optimizer/distrib_optimizer.py``
  (l.361, l.420, l.582) and ``optimizer/clip_grads.py`` (l.167).
* the CUDA RNG tracker (``tensor_parallel/random.py``): ``model_parallel_cuda_manual_seed`` and
  every dropout region's ``get_cuda_rng_tracker().fork()`` read/write the CUDA generator.

Rather than copying or editing those files, :func:`install_cpu_compat` installs, once per
process and only when CUDA is absent:

1. ``torch.cuda.current_device`` returning ``0`` (it raises on a CPU build), so the call sites
   above get a device index that (2) then maps to the CPU;
2. a ``TorchFunctionMode`` that, **for calls made from megatron's own code only**, rewrites a
   CUDA ``device`` argument to ``"cpu"``, turns ``Tensor.cuda()`` into a no-op and makes
   ``Tensor.type()`` of a CPU tensor report the ``torch.cuda.*`` name. Scoping by caller keeps
   our own code honest: a stray ``device="cuda"`` in ``scape`` still fails on CPU, as on a
   machine without a GPU it should;
3. an inert CUDA RNG tracker: ``torch.cuda.get_rng_state`` and megatron's private
   ``_get_cuda_rng_state`` return a dummy state and ``_set_cuda_rng_state`` does nothing. On CPU
   dropout draws from the CPU default generator, which with tensor parallel size 1 is what the
   forked "model-parallel" stream would have been used for anyway. (Our models use dropout 0.)

Each replaced function is one that raises on a CPU-only torch build, so the patches cannot
change the behaviour of code that worked before. On a CUDA machine nothing is touched.

The mode maps only megatron's calls, yet every torch call pays its Python handler (about
6 us: a frame walk). SCAPE's step makes a few thousand calls, bucket by bucket and block by
block, none of them megatron's, so the adapter runs it inside :func:`outside_megatron`,
which turns the mode off for that code (11-14 ms of a 2-rank SCAPE-99 step of the bench
model, 10.2M parameters, profiled on 2 cores).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["install_cpu_compat", "is_cpu_compat_installed", "outside_megatron"]

_MODE: _MegatronOnCpu | None = None
_DUMMY_RNG_STATE = torch.zeros(8, dtype=torch.uint8)


def _called_from_megatron() -> bool:
    """True if the nearest non-torch frame above the mode's handler is megatron's code."""
    frame = sys._getframe(2)  # 0: this function, 1: __torch_function__, 2: the caller
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("torch"):
            return name.startswith("megatron.")
        frame = frame.f_back
    return False


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index means a CUDA ordinal
    if isinstance(device, str | torch.device):
        return torch.device(device).type == "cuda"
    return False


class _MegatronOnCpu(TorchFunctionMode):
    """Maps megatron's CUDA device arguments, ``.cuda()`` and type-name checks to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            if _called_from_megatron():
                return args[0]
        elif func is torch.Tensor.type:
            if len(args) == 1 and not kwargs and _called_from_megatron():
                name = func(*args)
                if args[0].device.type == "cpu":
                    return name.replace("torch.", "torch.cuda.", 1)
                return name
        elif _is_cuda_device(kwargs.get("device")) and _called_from_megatron():
            kwargs = {**kwargs, "device": "cpu"}
        elif (
            func is torch.Tensor.to
            and len(args) > 1
            and _is_cuda_device(args[1])
            and _called_from_megatron()
        ):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def is_cpu_compat_installed() -> bool:
    return _MODE is not None


@contextmanager
def outside_megatron() -> Iterator[None]:
    """Run code that makes no megatron call (SCAPE's own step) without the mode and its
    per-call cost. A no-op where the mode is not installed (CUDA)."""
    if _MODE is None:
        yield
        return
    with torch._C.DisableTorchFunction():
        yield


def install_cpu_compat() -> bool:
    """Install the CPU compatibility layer if CUDA is absent; return whether it is active.

    Idempotent, and a strict no-op (nothing imported, nothing patched) when
    ``torch.cuda.is_available()``. Call it in every process before building megatron objects;
    the mode lives on the calling thread's torch-function stack.
    """
    global _MODE
    if torch.cuda.is_available():
        return False
    if _MODE is not None:
        return True
    from megatron.core.tensor_parallel import random as mcore_random

    torch.cuda.current_device = lambda: 0
    torch.cuda.get_rng_state = lambda device="cuda": _DUMMY_RNG_STATE.clone()
    mcore_random._get_cuda_rng_state = lambda *args, **kwargs: _DUMMY_RNG_STATE.clone()
    mcore_random._set_cuda_rng_state = lambda *args, **kwargs: None
    _MODE = _MegatronOnCpu()
    _MODE.__enter__()
    return True
