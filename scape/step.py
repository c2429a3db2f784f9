"""One rank's SCAPE step over one bucket, behind one call, with one implementation per device.

The Megatron adapter holds a :class:`BucketStep` per bucket; the simulator one per bucket and
worker (each worker is a rank). A step is, per bucket:

1. :meth:`BucketStep.pack` into the bucket's payload (W*n + 1,) in the wire dtype: this
   rank's values at the masks (``masks`` None: the dense warm-up, every entry) and its
   finite flag last (0, or inf when ``beta * m + g`` has a non-finite entry). Then the one
   all-reduce of the payloads (the caller's).
2. :meth:`BucketStep.finish` with the summed buffer: commit (``m = beta * m + g - sent``),
   and with an :class:`Update` decode q, weight decay and the update of p and v; with
   ``next_mask`` the owner's mask of its own shard for the next step.

Two implementations of the same arithmetic (:mod:`scape.shard`'s):

* ``blocked`` (CPU): :mod:`scape.shard` and :mod:`scape.basis` as they are, walking each shard
  in cache-sized blocks with a candidate buffer reused step to step; the quality study's
  numbers are this path's bits.
* ``fused`` (CUDA): :mod:`scape.fused`'s Triton kernels, one call per bucket and pass, two
  passes over memory (``pack``; commit, decode, update and the bf16 params in ``finish``)
  and the select over the owned shard. It agrees with ``blocked`` to fp32 rounding
  (tests: under Triton's CPU interpreter).

Both name their parts for torch.profiler (``benchmarks.megatron_step --parts``):
``scape.commit``, ``scape.update`` (the fused path's one kernel commits too) and
``scape.select``; the adapter names ``scape.pack``.

:func:`resolve_implementation` is the one place that chooses between them by device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor
from torch.profiler import record_function

from scape.basis import ShardBasis, selected_count
from scape.config import ScapeConfig
from scape.shard import (
    WIRE_DTYPES,
    accumulate,
    all_finite,
    buffer_sq_norm,
    clip_coefficient,
    commit_moment_,
    owner_mask,
    pack,
    step_bucket_,
)

__all__ = [
    "IMPLEMENTATIONS",
    "BucketStep",
    "Scratch",
    "Geometry",
    "Update",
    "make_bucket_step",
    "resolve_implementation",
    "step_clip",
]

IMPLEMENTATIONS = ("blocked", "fused")


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_implementation(name: str | None, device: torch.device | str) -> str:
    """The implementation a step on ``device`` runs: ``name`` if given (checked), else
    ``fused`` on CUDA where Triton is installed and ``blocked`` everywhere else."""
    device = torch.device(device)
    if name is None:
        return "fused" if device.type == "cuda" and _triton_importable() else "blocked"
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"SCAPE implementation {name!r} is not one of {IMPLEMENTATIONS}")
    if name == "fused":
        if not _triton_importable():
            raise ValueError(
                "SCAPE implementation 'fused' needs Triton (pip install triton, or a CUDA "
                "build of torch, which brings it); use 'blocked'"
            )
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"SCAPE implementation 'fused' runs Triton kernels: on {device.type} only "
                "under TRITON_INTERPRET=1 (set before importing scape); use 'blocked'"
            )
    return name


@dataclass(frozen=True)
class Geometry:
    """A bucket of ``world_size`` shards of ``shard_size`` entries, read in chunks."""

    shard_size: int
    world_size: int
    chunk: int
    k: int

    @property
    def full(self) -> int:  # full chunks per shard
        return self.shard_size // self.chunk

    @property
    def tail(self) -> int:  # entries of the shorter last chunk (0: none)
        return self.shard_size % self.chunk

    @property
    def k_tail(self) -> int:
        return min(self.k, self.tail)

    @property
    def num_selected(self) -> int:  # n, coefficients per shard
        return selected_count(self.shard_size, self.chunk, self.k)

    @property
    def rows_per_shard(self) -> int:
        return self.full + (1 if self.tail else 0)

    @property
    def n_rows(self) -> int:
        return self.world_size * self.rows_per_shard

    @property
    def numel(self) -> int:
        return self.world_size * self.shard_size


@dataclass(frozen=True)
class Update:
    """What :meth:`BucketStep.finish` steps with the decoded q: ``param`` (W*S,) fp32 in place,
    ``second_moment`` (W*S,) for the rms update (None: sign), ``param_out`` the model's
    lower-precision params written from ``param`` (None: ``param`` is the model's), and the
    step's scalars; ``clip`` from :func:`step_clip` (None: no clipping). The constants (the
    second moment's beta, eps) are the :class:`BucketStep`'s."""

    param: Tensor
    second_moment: Tensor | None
    param_out: Tensor | None
    decay_factor: float
    lr: float  # this step's, from the schedule
    step: int  # accepted updates, 1-based: the second moment's bias correction
    clip: float | Tensor | None


def step_clip(
    synced: list[Tensor], max_norm: float | None, implementation: str
) -> tuple[float | Tensor, float | Tensor | None]:
    """``(||q||, clip coefficient)`` of a step from its summed buffers (Parseval: no decode;
    see :func:`scape.shard.buffer_sq_norm`). ``blocked``: Python floats, summed bucket by
    bucket in float64 as the quality runs did; ``fused``: 0-dim device tensors (the kernels
    read the coefficient from memory, so nothing waits for the host), the coefficient 1 where
    Megatron's rule would not scale."""
    if implementation == "blocked":
        norm = sum(buffer_sq_norm(s) for s in synced) ** 0.5
        return norm, clip_coefficient(norm, max_norm)
    squares = torch.stack([torch.dot(s.float(), s.float()) for s in synced])
    norm = squares.double().sum().sqrt()
    if max_norm is None or max_norm <= 0:
        return norm, None
    return norm, (max_norm / (norm + 1.0e-6)).clamp(max=1.0).float().reshape(1)


class Scratch:
    """One temporary buffer that every bucket of a rank borrows in turn (the buckets are
    stepped one after another): sized once, to the largest request."""

    def __init__(self) -> None:
        self._buffer: Tensor | None = None

    def get(self, numel: int, device: torch.device) -> Tensor:
        """A (numel,) fp32 view, valid until the next call."""
        if self._buffer is None or self._buffer.numel() < numel or self._buffer.device != device:
            self._buffer = torch.empty(numel, device=device)
        return self._buffer[:numel]


class BucketStep:
    """One rank's step over one bucket (see the module docstring); built once, reused.

    The payload of a step: this rank's values, in the wire dtype, and (where
    :meth:`has_flag`) one flag entry last. The caller owns it; in the fused dense warm-up
    with an fp32 wire it is the bucket's grad itself (:meth:`payload_is_grad`), so the warm-up
    needs no bucket-sized buffer. ``next_mask`` (this rank's mask of its own shard for the next
    step, or None when none is made) goes to both :meth:`pack` and :meth:`finish`: each
    implementation writes it once (the fused one, in the dense warm-up, at the pack, since
    the candidate it is made from is gone after that)."""

    implementation: str

    def __init__(
        self,
        geometry: Geometry,
        rank: int,
        config: ScapeConfig,
        device: torch.device | str,
        decay_runs: list[tuple[int, int]],
        eps: float,
        scratch: Scratch | None = None,
    ) -> None:
        self.geo, self.rank, self.config = geometry, rank, config
        self.scratch = scratch if scratch is not None else Scratch()  # shared by a rank's buckets
        self.device = torch.device(device)
        self.decay_runs = decay_runs  # [start, end) of entries weight decay applies to
        self.eps = eps  # the rms update's denominator term (the optimizer's eps)
        self.basis = ShardBasis(geometry.shard_size, config.chunk, config.k, self.device)
        self.wire_dtype = WIRE_DTYPES[config.value_dtype]
        # A density ramp (config.ramp_start_k) steps with one k and makes the next step's
        # mask with another: each k's geometry and basis, built once (the DCT is k's own).
        self._levels = {config.k: (geometry, self.basis)}
        self._next_geo, self._next_basis = geometry, self.basis

    def _level(self, k: int) -> tuple[Geometry, ShardBasis]:
        if k not in self._levels:
            geo = Geometry(self.geo.shard_size, self.geo.world_size, self.config.chunk, k)
            self._levels[k] = (geo, ShardBasis(geo.shard_size, geo.chunk, k, self.device))
        return self._levels[k]

    def set_k(self, k: int, next_k: int) -> None:
        """Step with ``k`` coefficients per chunk (the masks passed in are k's) and make the
        next step's mask with ``next_k`` (:meth:`ScapeConfig.k_at`); both are the config's k
        unless this is called."""
        self.geo, self.basis = self._level(k)
        self._next_geo, self._next_basis = self._level(next_k)
        if k == next_k == self.config.k and len(self._levels) > 1:
            # A ramp only lowers k: once it is over, its larger levels are done with.
            self._levels = {k: self._levels[k]}
            self._release_ramp()

    def _release_ramp(self) -> None:
        """Free what only a ramp's larger k needed (nothing here)."""

    @property
    def num_selected(self) -> int:
        return self.geo.num_selected

    @property
    def next_num_selected(self) -> int:
        """Coefficients per shard of the next step's mask."""
        return self._next_geo.num_selected

    def has_flag(self, dense: bool) -> bool:
        """Whether the payload ends in a finite flag (a dense payload needs none: every entry
        travels, so a non-finite one reaches the sum itself)."""
        return True

    def payload_is_grad(self, dense: bool) -> bool:
        """Whether the step's payload is the bucket's grad itself, reduced in place."""
        return False

    def payload_numel(self, dense: bool) -> int:
        """Entries of the bucket's payload: every rank's values (and the flag)."""
        values = self.geo.numel if dense else self.geo.world_size * self.num_selected
        return values + int(self.has_flag(dense))

    def values(self, payload: Tensor, dense: bool) -> Tensor:
        """The values of a (summed) payload, without its flag."""
        return payload[:-1] if self.has_flag(dense) else payload

    def own_range(self) -> tuple[int, int]:
        """This rank's shard, relative to the bucket."""
        s = self.geo.shard_size
        return self.rank * s, (self.rank + 1) * s

    def pack(self, moment: Tensor, grad: Tensor, masks: Tensor | None, payload: Tensor, *,
             next_mask: Tensor | None = None) -> None:  # fmt: skip
        raise NotImplementedError

    def finish(
        self,
        moment: Tensor,
        grad: Tensor,
        masks: Tensor | None,
        synced: Tensor,
        *,
        update: Update | None,
        next_mask: Tensor | None,
        commit: bool = True,
    ) -> None:
        raise NotImplementedError


class BlockedBucketStep(BucketStep):
    """:mod:`scape.shard`'s functions as they are (the CPU path, and the studies' bits)."""

    implementation = "blocked"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._candidate: Tensor | None = None  # (W*S,) reused: fresh pages cost on CPU
        self._wire: Tensor | None = None  # what this rank sent at the last pack

    def pack(self, moment, grad, masks, payload, *, next_mask=None) -> None:
        del next_mask  # made in finish, from the candidate this path keeps
        if self._candidate is None:
            self._candidate = torch.empty(self.geo.numel, device=moment.device)
        cand = accumulate(moment, grad, self.config.moment_beta, out=self._candidate)
        self._wire = pack(
            None if masks is None else self.basis,
            cand,
            None if masks is None else masks.long(),
            world_size=self.geo.world_size,
            value_dtype=self.config.value_dtype,
        )
        payload[:-1].copy_(self._wire)
        payload[-1] = torch.where(all_finite(cand), 0.0, float("inf"))

    def finish(self, moment, grad, masks, synced, *, update, next_mask, commit=True) -> None:
        basis = None if masks is None else self.basis
        masks = None if masks is None else masks.long()
        W = self.geo.world_size
        if commit:
            with record_function("scape.commit"):
                commit_moment_(moment, self._candidate, basis, masks, self._wire, world_size=W)
        if update is not None:
            with record_function("scape.update"):
                self._update(update, basis, masks, synced)
        if next_mask is not None:
            # After a dense step the moments are empty: the next mask comes from what was
            # just sent in full (the candidate), otherwise from the committed moment.
            lo, hi = self.own_range()
            statistic = self._candidate if masks is None else moment
            with record_function("scape.select"):
                next_mask.copy_(owner_mask(self._next_basis, statistic[lo:hi]))

    def _update(self, update: Update, basis, masks, synced) -> None:
        step_bucket_(
            update.param, update.second_moment, basis, masks, synced,
            world_size=self.geo.world_size, decay=self.decay_runs,
            decay_factor=update.decay_factor,
            update=self.config.update, step=update.step, lr=update.lr,
            beta=self.config.second_moment_beta, eps=self.eps, clip=update.clip,
        )  # fmt: skip
        if update.param_out is not None:
            update.param_out.copy_(update.param)


class FusedBucketStep(BucketStep):
    """:mod:`scape.fused`'s kernels: whole buckets per call, no candidate buffer, and a dense
    warm-up in the grad buffer (fp32 wire: it is the payload; a narrower wire: it keeps what
    the wire rounds away until the commit)."""

    implementation = "fused"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from scape import fused

        self._kernels = fused
        d, d_tail = self.basis._d, self.basis._d_tail
        # the chunk's DCT, then the tail's, in one tensor: the kernels pick a row's by offset
        flat = [d.reshape(-1)] + ([] if d_tail is None else [d_tail.reshape(-1)])
        self._dct = torch.cat(flat)
        # what this rank sent, read back by the commit: sized for the largest k, and for the
        # config's once a ramp is over
        self._sent = self._sent_buffer(max(self.config.k_levels))
        self._no_clip = torch.ones(1, device=self.device)
        self._selected_at_pack = False

    def _sent_buffer(self, k: int) -> Tensor:
        n = self.geo.world_size * selected_count(self.geo.shard_size, self.config.chunk, k)
        return torch.empty(n, dtype=self.wire_dtype, device=self.device)

    def _release_ramp(self) -> None:
        self._sent = self._sent_buffer(self.config.k)

    def has_flag(self, dense: bool) -> bool:
        return not dense

    def payload_is_grad(self, dense: bool) -> bool:
        return dense and self.wire_dtype == torch.float32

    @cached_property
    def decay_bits(self) -> Tensor | None:
        """Weight decay's entries as a bitmap, (ceil(W*S / 8),) uint8, bit i of byte b for
        entry 8b + i: an eighth of a byte per entry rather than a bool each."""
        if not self.decay_runs:
            return None
        numel = self.geo.numel
        flags = torch.zeros(-(-numel // 8) * 8, dtype=torch.uint8, device=self.device)
        for start, end in self.decay_runs:
            flags[start:end] = 1
        weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=self.device)
        return (flags.view(-1, 8) * weights).sum(-1, dtype=torch.int32).to(torch.uint8)

    def _select(self, moment: Tensor, grad: Tensor | None, out: Tensor) -> None:
        lo, hi = self.own_range()
        with record_function("scape.select"):
            self._kernels.select(self._next_geo, moment[lo:hi], None if grad is None else grad[lo:hi],
                                 self._dct, out, beta=self.config.moment_beta,
                                 scratch=self.scratch.get(hi - lo, self.device))  # fmt: skip

    def pack(self, moment, grad, masks, payload, *, next_mask=None) -> None:
        dense = masks is None
        self._selected_at_pack = dense and next_mask is not None
        if self._selected_at_pack:  # from the candidate, before the grad buffer is reused
            self._select(moment, grad, next_mask)
        flag = None
        if not dense:
            flag = payload[-1:]
            flag.zero_()
        self._kernels.pack(self.geo, moment, grad, masks, self._dct, self.values(payload, dense),
                           flag, beta=self.config.moment_beta, world_size=self.geo.world_size)  # fmt: skip
        if not dense:
            if self._sent.numel() < payload.numel() - 1:  # a ramp's k after it (a resume)
                self._sent = self._sent_buffer(self.geo.k)
            self._sent[: payload.numel() - 1].copy_(payload[:-1])

    def finish(self, moment, grad, masks, synced, *, update, next_mask, commit=True) -> None:
        dense = masks is None
        if dense and next_mask is not None and not self._selected_at_pack:
            raise ValueError(
                "the fused step makes the dense warm-up's next mask at the pack (its candidate "
                "is gone after it): pass next_mask to pack as well"
            )
        kwargs = {}
        if update is not None:
            clip = update.clip
            if clip is None:
                clip = self._no_clip
            elif not isinstance(clip, Tensor):
                clip = torch.tensor([clip], dtype=torch.float32, device=self.device)
            beta2 = self.config.second_moment_beta
            kwargs = dict(param=update.param, second_moment=update.second_moment,
                          param_out=update.param_out, decay_bits=self.decay_bits, clip=clip,
                          decay_factor=update.decay_factor, lr=update.lr, beta2=beta2,
                          correction=1.0 - beta2**update.step, eps=self.eps)  # fmt: skip
        with record_function("scape.update"):
            sent = self._sent[: self.geo.world_size * self.num_selected]
            self._kernels.finish(self.geo, moment, grad, masks, self._dct, sent, synced,
                                 beta=self.config.moment_beta, world_size=self.geo.world_size,
                                 commit=commit, residual_in_grad=not self.payload_is_grad(dense),
                                 **kwargs)  # fmt: skip
        if next_mask is not None and not dense:
            self._select(moment, None, next_mask)


def make_bucket_step(
    implementation: str,
    geometry: Geometry,
    rank: int,
    config: ScapeConfig,
    device: torch.device | str,
    decay_runs: list[tuple[int, int]],
    eps: float,
    scratch: Scratch | None = None,
) -> BucketStep:
    """The bucket's step in ``implementation`` (from :func:`resolve_implementation`); the
    buckets of one rank share one ``scratch``."""
    cls = {"blocked": BlockedBucketStep, "fused": FusedBucketStep}[implementation]
    return cls(geometry, rank, config, device, decay_runs, eps, scratch)
