"""Let megatron-core's GPTModel, DDP and DistributedOptimizer run on CPU/gloo.

Megatron-Core assumes CUDA in a handful of kinds of call (the same kinds in 0.16.1 and
0.19.2, the two versions tested; :mod:`scape.megatron.versions` says where they differ):

* tensors created with ``device="cuda"`` or ``device=torch.cuda.current_device()``: the DDP
  buffers, the optimizer's ``found_inf`` / scale scratch tensors, grad-norm clipping, the
  global memory buffer, rotary embeddings and the default causal mask (built only when
  ``attention_mask=None``);
* type-name checks that demand ``torch.cuda.*Tensor`` (the distributed optimizer's wrapped
  params, grad clipping);
* the CUDA RNG tracker: ``model_parallel_cuda_manual_seed`` and every dropout region's
  ``get_cuda_rng_tracker().fork()`` read and write the CUDA generator;
* stream bookkeeping: 0.19's bucket-group grad sync waits on ``torch.cuda.current_stream()``
  for CUDA-graph events (0.16 has no such call on this path).

Rather than copying or editing those files, :func:`install_cpu_compat` installs, once per
process and only when CUDA is absent, two things, both **acting only for calls made from
megatron's own code** (the nearest caller outside torch is a ``megatron.*`` module). Calls
are recognised by what they are (a torch function and its device argument, a named
``torch.cuda`` function), never by a file or line number, so a new megatron-core release
that makes the same kinds of call is covered:

1. stand-ins for the ``torch.cuda`` functions that raise on a CPU-only build
   (:data:`STAND_INS`): ``current_device`` is ``0`` (which (2) maps to the CPU),
   ``current_stream`` an inert stream whose waits and records do nothing (there is one
   stream on a CPU), ``get_rng_state`` a dummy state; megatron's private
   ``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` likewise. Called from anywhere else
   they are the original functions: our own ``torch.cuda.current_stream()`` still raises;
2. a ``TorchFunctionMode`` that rewrites a CUDA ``device`` argument to ``"cpu"``, turns
   ``Tensor.cuda()`` into a no-op and makes ``Tensor.type()`` of a CPU tensor report the
   ``torch.cuda.*`` name. A stray ``device="cuda"`` in ``scape`` still fails on CPU, as on
   a machine without a GPU it should.

On CPU dropout draws from the CPU default generator, which with tensor parallel size 1 is
what the forked "model-parallel" stream would have been used for anyway (our models use
dropout 0). Each replaced function is one that raises on a CPU-only torch build, so the
patches cannot change the behaviour of code that worked before. On a CUDA machine nothing
is touched.

The mode maps only megatron's calls, yet every torch call pays its Python handler (about
6 us: a frame walk). SCAPE's step makes a few thousand calls, bucket by bucket and block by
block, none of them megatron's, so the adapter runs it inside :func:`outside_megatron`,
which turns the mode off for that code (11-14 ms of a 2-rank SCAPE-99 step of the bench
model, 10.2M parameters, profiled on 2 cores).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "STAND_INS",
    "install_cpu_compat",
    "is_cpu_compat_installed",
    "outside_megatron",
]

_MODE: _MegatronOnCpu | None = None
_DUMMY_RNG_STATE = torch.zeros(8, dtype=torch.uint8)


def _megatron_is_calling(frame: FrameType | None) -> bool:
    """True if the nearest frame at or above ``frame`` outside torch is megatron's code."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("torch"):
            return name.startswith("megatron.")
        frame = frame.f_back
    return False


def _called_from_megatron() -> bool:
    """For the mode's handler: is the code that called the torch function megatron's?"""
    return _megatron_is_calling(sys._getframe(2))  # 0: here, 1: __torch_function__


class _InertStream:
    """The one "stream" of a CPU: work is already ordered, so waiting and recording are no-ops."""

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


# (module, attribute, stand-in): what megatron's calls get on a CPU-only build.
STAND_INS: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("torch.cuda", "current_device", lambda: 0),
    ("torch.cuda", "current_stream", lambda device=None: _InertStream()),
    ("torch.cuda", "get_rng_state", lambda device="cuda": _DUMMY_RNG_STATE.clone()),
    ("torch.cuda", "synchronize", lambda device=None: None),  # dist_checkpointing's saves
    (
        "megatron.core.tensor_parallel.random",
        "_get_cuda_rng_state",
        lambda *args, **kwargs: _DUMMY_RNG_STATE.clone(),
    ),
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state", lambda *a, **kw: None),
)


def _for_megatron_only(original: Callable[..., Any], stand_in: Callable[..., Any]):
    """``original`` everywhere, except that megatron's calls get ``stand_in``."""

    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        if _megatron_is_calling(sys._getframe(1)):
            return stand_in(*args, **kwargs)
        return original(*args, **kwargs)

    dispatch.__scape_original__ = original
    return dispatch


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
    for module_name, attr, stand_in in STAND_INS:
        module = importlib.import_module(module_name)
        setattr(module, attr, _for_megatron_only(getattr(module, attr), stand_in))
    _MODE = _MegatronOnCpu()
    _MODE.__enter__()
    return True
