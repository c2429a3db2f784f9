"""The step being benchmarked, behind one seam: a ``Method`` runs one training step.

This is the *communicator-level* workload: a flat fp32 parameter/gradient buffer (one
bucket, ZeRO-1 layout: rank r owns shard r) fed by a real model's forward/backward
(:mod:`benchmarks.compute`), synchronized with ``scape.comm.SparseCommunicator`` and
updated with ``scape.shard`` / ``scape.adams`` -- the same functions the Megatron adapter
calls. What it leaves out of a Megatron step: bucketing, overlap of the gradient
reduce-scatter with backward (dense Megatron can hide part of its exchange there),
bf16 model params and grad clipping. A Megatron-backed workload plugs in with the same
``Method`` protocol.

Phases each step records (seconds, this rank): compute (forward+backward); SCAPE's
mask_select (scores and top-k), mask_send (encoding, and for delta the length exchange,
then issuing the all-gather), mask_wait (the exposed part of the mask all-gather),
mask_decode; pack; grad_sync (reduce-scatter); update (optimizer on the shard, residual
commit, weight decay); param_sync (all-gather); unpack (writing gathered values).
Bytes come from the communicator's counter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from scape.adams import adams_update_, apply_weight_decay_
from scape.comm import MASKS, SparseCommunicator, bucket_positions
from scape.config import ScapeConfig
from scape.encoding import (
    decode_mask,
    decode_mask_delta,
    encode_mask,
    encode_mask_delta,
    encoded_nbytes,
    resolve_encoding,
)
from scape.layout import FlatLayout
from scape.masks import num_selected
from scape.shard import WIRE_DTYPES, commit_residual_, next_mask, owner_update_, pack_values

__all__ = ["FlatModel", "HParams", "Method", "MethodSpec", "StepRecord", "build_method"]

PHASES = ("compute", "mask_select", "mask_send", "mask_wait", "mask_decode", "pack",
          "grad_sync", "update", "param_sync", "unpack")  # fmt: skip


@dataclass(frozen=True)
class HParams:
    lr: float = 6e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1


@dataclass(frozen=True)
class MethodSpec:
    """One contender. density 1.0 is dense ZeRO-1; below, SCAPE at that density."""

    name: str
    optimizer: str = "adams"  # dense only: "adams" or "adamw"
    density: float = 1.0
    encoding: str = "auto"  # SCAPE masks: auto | int32 | offset16 | bitmap | delta
    overlap: bool = True  # SCAPE: one-step-delayed mask, all-gathered behind compute
    wire: str = "bfloat16"  # dtype of gradient and parameter values on the wire
    selection: str = "sampled_threshold"  # SCAPE: exact top-k found via a sampled threshold

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MethodSpec:
        return cls(**d)


@dataclass
class StepRecord:
    method: str
    step: int
    loss: float
    phases: dict[str, float]
    bytes: dict[str, float]
    mask_overlap: float | None = None  # |M_t ∩ M_{t+1}| / k on this rank's shard
    mask_changed: int | None = None  # d = entries entering this rank's shard mask
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


class Method(Protocol):
    spec: MethodSpec

    def step(self, t: int, batch: Any) -> StepRecord: ...


class _Clock:
    """Accumulates wall time into named phases; ``lap(name)`` closes the running one."""

    def __init__(self) -> None:
        self.phases = dict.fromkeys(PHASES, 0.0)
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] += now - self._t
        self._t = now


class FlatModel:
    """The model's params and grads as views of flat buffers, as in Megatron's buffers.

    Each method owns its own flat parameter buffer (they train independently on the same
    data); ``bind`` points the model at it. Backward accumulates in place into ``grad``.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any], Tensor],
                 world_size: int) -> None:  # fmt: skip
        self.model, self.loss_fn = model, loss_fn
        self.params = list(model.parameters())
        self.layout = FlatLayout.contiguous([p.numel() for p in self.params], world_size)
        self.grad = torch.zeros(self.layout.total)
        self.initial = torch.zeros(self.layout.total)
        for p, off in zip(self.params, self.layout.param_offsets, strict=True):
            self.initial[off : off + p.numel()] = p.detach().view(-1)
            p.grad = self.grad[off : off + p.numel()].view_as(p)

    @property
    def shard_size(self) -> int:
        return self.layout.shard_size(0)

    def bind(self, flat: Tensor) -> None:
        for p, off in zip(self.params, self.layout.param_offsets, strict=True):
            p.data = flat[off : off + p.numel()].view_as(p)

    def forward_backward(self, flat: Tensor, batch: Any) -> float:
        self.bind(flat)
        self.grad.zero_()
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        return float(loss.detach())


class DenseZero1:
    """Dense ZeRO-1: reduce-scatter all grads, AdamS/AdamW on the shard, all-gather params."""

    def __init__(self, spec: MethodSpec, flat: FlatModel, comm: SparseCommunicator,
                 hp: HParams) -> None:  # fmt: skip
        self.spec, self.flat, self.comm, self.hp = spec, flat, comm, hp
        self.params = flat.initial.clone()
        s = flat.shard_size
        self.shard = slice(comm.rank * s, (comm.rank + 1) * s)
        self.main = self.params[self.shard].clone()
        self.exp_avg = torch.zeros(s)
        self.adamw = None
        if spec.optimizer == "adamw":
            self.adamw = torch.optim.AdamW([self.main], lr=hp.lr, betas=(hp.beta1, hp.beta2),
                                           eps=hp.eps, weight_decay=hp.weight_decay,
                                           foreach=False)  # fmt: skip
        self.wire = WIRE_DTYPES[spec.wire]

    def step(self, t: int, batch: Any) -> StepRecord:
        before = self.comm.counter.snapshot()
        clock = _Clock()
        loss = self.flat.forward_backward(self.params, batch)
        clock.lap("compute")
        packed = (self.flat.grad * (1.0 / self.comm.world_size)).to(self.wire)
        clock.lap("pack")
        grad, _ = self.comm.reduce_scatter(packed)
        clock.lap("grad_sync")
        hp = self.hp
        if self.adamw is None:
            adams_update_(self.main, self.exp_avg, grad.float(), step=t, lr=hp.lr,
                          beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps,
                          weight_decay=hp.weight_decay)  # fmt: skip
        else:
            self.main.grad = grad.float()
            self.adamw.step()
        clock.lap("update")
        gathered, _ = self.comm.all_gather(self.main.to(self.wire))
        clock.lap("param_sync")
        self.params.copy_(gathered)
        clock.lap("unpack")
        return StepRecord(self.spec.name, t, loss, clock.phases, _delta(before, self.comm))


def _delta(before: dict[str, float], comm: SparseCommunicator) -> dict[str, float]:
    after = comm.counter.snapshot()
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


class ScapeStep:
    """SCAPE over one bucket: shared masks, one sparse reduce-scatter, masked AdamS,
    one sparse all-gather; the next mask is chosen by the owner and exchanged either
    asynchronously behind the next step's compute (overlap) or synchronously before use."""

    def __init__(self, spec: MethodSpec, flat: FlatModel, comm: SparseCommunicator,
                 hp: HParams) -> None:  # fmt: skip
        self.spec, self.flat, self.comm, self.hp = spec, flat, comm, hp
        # sampled_threshold finds exactly the top-k (same masks), several times faster on CPU.
        self.cfg = ScapeConfig(density=spec.density, delay_mask=spec.overlap,
                               value_dtype=spec.wire, selection=spec.selection)  # fmt: skip
        self.W, self.r = comm.world_size, comm.rank
        self.S = flat.shard_size
        self.k = num_selected(self.S, spec.density)
        self.params = flat.initial.clone()
        self.shard = slice(self.r * self.S, (self.r + 1) * self.S)
        self.main = self.params[self.shard].clone()
        self.exp_avg = torch.zeros(self.S)
        self.age = torch.zeros(self.S, dtype=torch.int32)
        self.residual = torch.zeros(flat.layout.total)
        self.masks: list[Tensor] | None = None  # every shard's mask for this step
        self.pending: tuple[Tensor, Any, list[Tensor] | None] | None = None
        self.wire = WIRE_DTYPES[spec.wire]

    # -- masks ---------------------------------------------------------------
    def _own_mask(self, t: int, local_accum: Tensor) -> Tensor:
        return next_mask(self.cfg, exp_avg=self.exp_avg, local_accum=local_accum,
                         age=self.age, step=t, shard_id=self.r)  # fmt: skip

    def _send_mask(self, mask: Tensor, async_op: bool) -> None:
        """Encode and start the all-gather of this rank's mask (delta when possible)."""
        prev = self.masks
        if self.spec.encoding == "delta" and prev is not None:
            payload = encode_mask_delta(prev[self.r], mask, self.S)
            lengths, _ = self.comm.all_gather(torch.tensor([payload.numel()], dtype=torch.int32),
                                              kind=MASKS)  # fmt: skip
            width = int(lengths.max())
            padded = torch.zeros(width, dtype=torch.uint8)
            padded[: payload.numel()] = payload
            out, work = self.comm.all_gather_masks(padded, async_op=async_op)
            self.pending = (out, work, prev)
        else:
            enc = "auto" if self.spec.encoding == "delta" else self.spec.encoding
            out, work = self.comm.all_gather_masks(encode_mask(mask, self.S, enc),
                                                   async_op=async_op)  # fmt: skip
            self.pending = (out, work, None)
        self._sent_own = mask

    def _wait_masks(self) -> None:
        work = self.pending[1]
        if work is not None:
            work.wait()

    def _decode_masks(self) -> list[Tensor]:
        out, _, prev = self.pending
        self.pending = None
        width = out.numel() // self.W
        # clone(): scape.encoding.decode_mask views bytes as int32/int16, which needs an
        # aligned storage offset; a slice of the gathered buffer need not have one.
        chunks = [out[j * width : (j + 1) * width].clone() for j in range(self.W)]
        if prev is not None:
            masks = [decode_mask_delta(c, prev[j], self.S) for j, c in enumerate(chunks)]
        else:
            enc = "auto" if self.spec.encoding == "delta" else self.spec.encoding
            masks = [decode_mask(c, self.S, self.k, enc) for c in chunks]
        if not torch.equal(masks[self.r], self._sent_own):
            raise RuntimeError("decoded own mask differs from the one sent (encoding bug)")
        return masks

    def _churn(self, new_own: Tensor) -> int | None:
        """How many entries of this rank's mask change against the last one (None: first)."""
        if self.masks is None:
            return None
        in_prev = torch.zeros(self.S, dtype=torch.bool)
        in_prev[self.masks[self.r]] = True
        return int(self.k - in_prev[new_own].sum())

    # -- one step ------------------------------------------------------------
    def step(self, t: int, batch: Any) -> StepRecord:
        before = self.comm.counter.snapshot()
        clock = _Clock()
        loss = self.flat.forward_backward(self.params, batch)
        grad = self.flat.grad
        clock.lap("compute")
        dense = t <= self.cfg.dense_warmup_steps
        changed = None
        if not dense and not self.spec.overlap:
            # No delay: this step's mask is made now and exchanged on the critical path.
            reads_accum = self.cfg.statistic in ("momentum_residual", "raw_gradient")
            mask = self._own_mask(t, self.residual + grad if reads_accum else self.residual)
            changed = self._churn(mask)
            clock.lap("mask_select")
            self._send_mask(mask, async_op=False)
            clock.lap("mask_send")
        if not dense:
            self._wait_masks()
            clock.lap("mask_wait")
            self.masks = self._decode_masks()
            clock.lap("mask_decode")
        masks = [torch.arange(self.S)] * self.W if dense else self.masks
        positions = bucket_positions(masks, self.S)
        packed = pack_values(self.residual, grad, positions, world_size=self.W,
                             value_dtype=self.spec.wire)  # fmt: skip
        clock.lap("pack")
        synced, _ = self.comm.reduce_scatter(packed)
        clock.lap("grad_sync")
        commit_residual_(self.residual, grad, positions, packed, world_size=self.W,
                         error_feedback=True)  # fmt: skip
        hp = self.hp
        # Every rank decays all of its params locally (no traffic), the owner its main copy.
        apply_weight_decay_(self.params, lr=hp.lr, weight_decay=hp.weight_decay)
        apply_weight_decay_(self.main, lr=hp.lr, weight_decay=hp.weight_decay)
        own = masks[self.r]
        updated = owner_update_(self.main, self.exp_avg, own, synced, step=t, lr=hp.lr,
                                beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps)  # fmt: skip
        self.age.add_(1)
        self.age[own] = 0
        clock.lap("update")
        gathered, _ = self.comm.all_gather(updated.to(self.wire))
        clock.lap("param_sync")
        self.params[positions] = gathered.float()
        clock.lap("unpack")
        if self.spec.overlap and t >= self.cfg.dense_warmup_steps:
            nxt = self._own_mask(t + 1, self.residual)
            if dense:
                self.masks = None  # the first sparse mask travels in a fixed encoding
            changed = self._churn(nxt)
            clock.lap("mask_select")
            self._send_mask(nxt, async_op=True)
            clock.lap("mask_send")
        overlap = None if changed is None else 1.0 - changed / self.k
        return StepRecord(self.spec.name, t, loss, clock.phases, _delta(before, self.comm),
                          mask_overlap=overlap, mask_changed=changed)  # fmt: skip


def build_method(spec: MethodSpec, flat: FlatModel, comm: SparseCommunicator,
                 hp: HParams = HParams()) -> Method:  # fmt: skip
    if spec.density >= 1.0:
        return DenseZero1(spec, flat, comm, hp)
    return ScapeStep(spec, flat, comm, hp)


def mask_nbytes_fixed(shard_size: int, density: float, encoding: str) -> int:
    """Bytes of one shard's mask in a fixed encoding (for tables); ``auto`` resolved."""
    k = num_selected(shard_size, density)
    return encoded_nbytes(shard_size, k, resolve_encoding(encoding, shard_size, k))
