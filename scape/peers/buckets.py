"""Per-parameter hook state, stored flat per DDP bucket, that follows DDP's re-bucketing.

DDP hands a comm hook one flat bucket at a time, so hook state (residuals, momenta) is
naturally a flat buffer per bucket. But DDP's bucket layout is not fixed: it builds buckets
in parameter-registration order, then rebuilds them once, after the first iteration, in
gradient-ready order. For a one-bucket model the index (0) and size stay the same while the
entries are permuted (registration [w1, b1, w2, b2] becomes [b2, w2, b1, w1]), and a fresh
DDP after a resume starts from registration order again. State keyed only by the bucket
index would silently be added to the wrong parameters, so :class:`ParamBuffers` remembers
which parameters each flat buffer holds and moves their slices when the layout changes.

Parameters are keyed by their position in ``params`` (the DDP module's parameters, in
``module.parameters()`` order) when that is given, which is stable across processes and so
lets the state be checkpointed; otherwise by ``id()``, which is enough within one process.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ParamBuffers", "completed_future", "ddp_comm_hook", "param_index"]


def param_index(params: Iterable[Tensor] | None) -> dict[int, int] | None:
    """``id(p) -> position`` for the parameters a hook may see, or None (key by ``id``)."""
    return None if params is None else {id(p): i for i, p in enumerate(params)}


def bucket_keys(bucket: dist.GradBucket, index: dict[int, int] | None) -> tuple[Hashable, ...]:
    """The keys of the bucket's parameters, in the bucket's order."""
    if index is None:
        return tuple(id(p) for p in bucket.parameters())
    try:
        return tuple(index[id(p)] for p in bucket.parameters())
    except KeyError:
        raise ValueError(
            "a DDP bucket holds a parameter that is not in `params`; pass the DDP module's "
            "parameters (module.parameters(), in order)"
        ) from None


def ddp_comm_hook(fn: Callable) -> Callable:
    """Give a hook the annotation objects DDP's ``register_comm_hook`` checks by equality.

    With ``from __future__ import annotations`` they are strings, which DDP rejects.
    """
    fn.__annotations__.update(bucket=dist.GradBucket, **{"return": torch.futures.Future[Tensor]})
    return fn


def completed_future(tensor: Tensor) -> torch.futures.Future[Tensor]:
    fut: torch.futures.Future[Tensor] = torch.futures.Future()
    fut.set_result(tensor)
    return fut


@dataclass
class _Bucket:
    keys: tuple[Hashable, ...]
    numels: tuple[int, ...]
    flat: dict[str, Tensor]  # name -> (sum(numels),) fp32


class ParamBuffers:
    """Named fp32 buffers per parameter, handed out as one flat tensor per bucket.

    ``get(bucket)`` returns ``{name: (bucket numel,) fp32}``, zeros for parameters never seen,
    their previous values otherwise (wherever they lived before). Mutate them in place.
    """

    def __init__(self, names: tuple[str, ...], params: Iterable[Tensor] | None = None):
        self.names = tuple(names)
        self.index = param_index(params)
        self._live: dict[int, _Bucket] = {}  # bucket index -> its current layout and buffers
        self._owner: dict[Hashable, int] = {}  # parameter key -> bucket index in _live
        # Per-parameter slices not in any live bucket: left behind by an old layout (views into
        # its flat buffers) or loaded from a checkpoint; claimed by the next bucket holding them.
        self._loose: dict[Hashable, dict[str, Tensor]] = {}

    def keys(self, bucket: dist.GradBucket) -> tuple[Hashable, ...]:
        return bucket_keys(bucket, self.index)

    def get(self, bucket: dist.GradBucket) -> dict[str, Tensor]:
        idx, keys = bucket.index(), self.keys(bucket)
        live = self._live.get(idx)
        if live is not None and live.keys == keys:
            return live.flat
        # New or changed layout: release every bucket holding one of these parameters (and
        # the old occupant of this index), then assemble this bucket from the loose slices.
        stale = {self._owner[k] for k in keys if k in self._owner}
        if live is not None:
            stale.add(idx)
        for old in stale:
            self._release(old)
        numels = tuple(p.numel() for p in bucket.parameters())
        buffer = bucket.buffer()
        if sum(numels) != buffer.numel():
            raise RuntimeError(
                f"bucket {idx}: parameters hold {sum(numels)} entries, its buffer {buffer.numel()}"
            )
        flat = {
            name: torch.zeros(buffer.numel(), dtype=torch.float32, device=buffer.device)
            for name in self.names
        }
        offset = 0
        for key, numel in zip(keys, numels, strict=True):
            slices = self._loose.pop(key, None)
            if slices is not None:
                for name in self.names:
                    if slices[name].numel() != numel:
                        raise ValueError(
                            f"saved state {name!r} of parameter {key} has {slices[name].numel()} "
                            f"entries, the parameter {numel}"
                        )
                    flat[name][offset : offset + numel].copy_(slices[name].reshape(-1))
            self._owner[key] = idx
            offset += numel
        self._live[idx] = _Bucket(keys, numels, flat)
        return flat

    def _release(self, idx: int) -> None:
        bucket = self._live.pop(idx)
        offset = 0
        for key, numel in zip(bucket.keys, bucket.numels, strict=True):
            self._loose[key] = {n: t[offset : offset + numel] for n, t in bucket.flat.items()}
            self._owner.pop(key, None)
            offset += numel

    def _per_param(self) -> dict[Hashable, dict[str, Tensor]]:
        out = dict(self._loose)
        for bucket in self._live.values():
            offset = 0
            for key, numel in zip(bucket.keys, bucket.numels, strict=True):
                out[key] = {n: t[offset : offset + numel] for n, t in bucket.flat.items()}
                offset += numel
        return out

    def state_dict(self) -> dict:
        """``{"params": {position: {name: (numel,) fp32}}}``: independent of the bucket layout."""
        per_param = self._per_param()
        if per_param and self.index is None:
            raise ValueError(
                "hook state cannot be saved without `params`: construct the hook with "
                "params=ddp_module.parameters() so parameters have stable keys"
            )
        return {
            "params": {
                k: {n: t.detach().clone() for n, t in v.items()} for k, v in per_param.items()
            }
        }

    def load_state_dict(self, state: dict) -> None:
        params = state["params"]
        if params and self.index is None:
            raise ValueError("hook state cannot be loaded without `params` (see state_dict)")
        for key, slices in params.items():
            if set(slices) != set(self.names):
                raise ValueError(
                    f"saved state of parameter {key} has buffers {sorted(slices)}, "
                    f"expected {sorted(self.names)}"
                )
        self._live.clear()
        self._owner.clear()
        self._loose = {
            int(k): {n: t.detach().to(torch.float32).clone() for n, t in v.items()}
            for k, v in params.items()
        }
