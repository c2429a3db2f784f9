"""W data-parallel workers in one process: the oracle for the distributed code, and the
fast vehicle for quality studies.

All replicas of a data-parallel run hold bit-identical params, so the simulator keeps one
model and runs each worker's forward/backward on it in turn. What differs per worker is
real state: its fresh gradient and (SCAPE) its own first moment. The all-reduce becomes a
sum in rank order, in the wire dtype, as gloo sums it.

Methods: ``adamw`` (torch.optim.AdamW) and ``adams`` (scape.AdamS) on the averaged
gradient, the dense references; ``scape`` the sparse step: one :class:`scape.step.BucketStep`
per worker and bucket, exactly as the Megatron adapter holds one per bucket, so both run the
same implementation (``blocked`` on CPU, ``fused`` Triton kernels on CUDA; ``implementation``
chooses another).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from scape.adams import AdamHParams, AdamS
from scape.basis import ShardBasis, selected_count
from scape.comm import GRAD_VALUES, PARAM_VALUES, SCALARS, ring_bytes_per_rank, step_bytes_per_rank
from scape.config import ScapeConfig
from scape.layout import FlatLayout
from scape.shard import WIRE_DTYPES, all_finite, clip_coefficient, decay_runs, decode, runs_within
from scape.step import Geometry, Update, make_bucket_step, resolve_implementation, step_clip

__all__ = [
    "METHODS",
    "clip_coefficient",
    "Simulator",
    "StepResult",
    "default_decay_filter",
    "load_simulator_state",
    "simulator_state",
]

METHODS = ("adamw", "adams", "scape")
LossFn = Callable[[nn.Module, Any], Tensor]


def default_decay_filter(name: str, param: Tensor) -> bool:
    """Megatron's rule (its default ``no_weight_decay_cond``): decay every param but biases and
    1-D ones (norm weights), the groups the Megatron adapter and the peers' engine use too."""
    return not (name.endswith(".bias") or param.ndim == 1)


@dataclass
class StepResult:
    step: int
    loss: float
    grad_norm: float
    skipped: bool
    bytes: dict[str, float] = field(default_factory=dict)  # per rank, this step, by kind
    mask_overlap: float | None = None  # |M_t ∩ M_{t+1}| / n, over all shards
    moment_norm: float | None = None  # norm of all workers' first moments together


class Simulator:
    """Train ``model`` as W data-parallel workers would; ``step`` takes W batches."""

    def __init__(
        self,
        model: nn.Module,
        world_size: int,
        *,
        method: str = "scape",
        hparams: AdamHParams | None = None,
        scape: ScapeConfig | None = None,
        layout: FlatLayout | None = None,
        decay_filter: Callable[[str, Tensor], bool] = default_decay_filter,
        implementation: str | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        # no hparams: lr 1e-3, no clipping (the simulator's own defaults, not a recipe)
        hparams = hparams if hparams is not None else AdamHParams(lr=1e-3, clip_grad=0.0)
        self.model, self.world_size, self.method, self.hp = model, world_size, method, hparams
        self.scape = scape if scape is not None else ScapeConfig()
        self.step_count = 0
        named = list(model.named_parameters())
        self.params = [p for _, p in named]
        self.device = self.params[0].device  # state lives where the model does
        self.decays = [decay_filter(n, p) for n, p in named]
        if method == "scape":
            self.implementation = resolve_implementation(implementation, self.device)
            self._init_scape(layout)
        else:
            groups = [
                {
                    "params": [p for p, d in zip(self.params, self.decays, strict=True) if d],
                    "weight_decay": hparams.weight_decay,
                },
                {
                    "params": [p for p, d in zip(self.params, self.decays, strict=True) if not d],
                    "weight_decay": 0.0,
                },
            ]
            cls = torch.optim.AdamW if method == "adamw" else AdamS
            self.optimizer = cls(
                groups, lr=hparams.lr, betas=hparams.betas, eps=hparams.eps, foreach=False
            )

    # ---------------------------------------------------------------- SCAPE state
    def _init_scape(self, layout: FlatLayout | None) -> None:
        W, cfg = self.world_size, self.scape
        self.bind_flat_params(layout or FlatLayout.contiguous([p.numel() for p in self.params], W))
        total = self.layout.total
        geometries = [Geometry(self.layout.shard_size(b), W, cfg.chunk, cfg.k)
                      for b in range(len(self.layout.buckets))]  # fmt: skip
        # steps[w][b]: worker w's step over bucket b (each worker is a rank)
        self.steps = [
            [make_bucket_step(self.implementation, geo, w, cfg, self.device, self.decay_runs[b],
                              self.hp.eps) for b, geo in enumerate(geometries)]
            for w in range(W)
        ]  # fmt: skip
        self.bases = [step.basis for step in self.steps[0]]
        self.moment = torch.zeros(W, total, device=self.device)  # each worker's own moment
        self.second_moment = torch.zeros(total, device=self.device) if cfg.update == "rms" else None
        self.updates = 0  # accepted steps (the rebuilt second moment's bias correction)
        # masks[b]: (W, n) the shards' masks for the coming step; None before the first
        self.masks: list[Tensor] | None = None
        self.mask_k = cfg.k  # k of ``masks`` (a density ramp's change step to step)
        self.last_used_masks: list[Tensor] | None = None  # for tests and studies
        self.last_synced: list[Tensor] | None = None  # see last_q

    @property
    def last_q(self) -> Tensor | None:
        """The dense update q (total,) every rank stepped with at the last accepted step,
        decoded on demand from the summed buffers (tests, studies); the step itself never
        holds it whole."""
        if self.last_synced is None:
            return None
        masks = self.last_used_masks
        return torch.cat([
            decode(None if masks is None else self.bases[b], None if masks is None else masks[b],
                   synced, self.world_size)
            for b, synced in enumerate(self.last_synced)
        ])  # fmt: skip

    def bind_flat_params(self, layout: FlatLayout) -> None:
        """Make the params views of one flat fp32 buffer laid out as ``layout`` (as in
        Megatron's param buffer), with a boolean mask of the entries weight decay applies to."""
        if layout.world_size != self.world_size or len(layout.param_offsets) != len(self.params):
            raise ValueError("layout does not match the model's parameters or world size")
        self.layout = layout
        self.flat_param = torch.zeros(layout.total, device=self.device)
        self.decay_mask = torch.zeros(layout.total, dtype=torch.bool, device=self.device)
        for p, off, d in zip(self.params, layout.param_offsets, self.decays, strict=True):
            self.flat_param[off : off + p.numel()].copy_(p.detach().view(-1))
            p.data = self.flat_param[off : off + p.numel()].view_as(p)
            self.decay_mask[off : off + p.numel()] = d
        runs = decay_runs(self.decay_mask)  # per bucket, relative to it (as the adapter)
        self.decay_runs = [runs_within(runs, lo, hi) for lo, hi in layout.buckets]

    def state_dict(self) -> dict[str, Any]:
        """Everything a SCAPE step reads besides params: for checkpoints and tests."""
        return {
            "moment": self.moment.clone(),
            "second_moment": None if self.second_moment is None else self.second_moment.clone(),
            "updates": self.updates,
            "masks": None if self.masks is None else [m.clone() for m in self.masks],
        }

    # ---------------------------------------------------------------- one step
    def worker_grads(
        self, batches: Sequence[Any], loss_fn: LossFn
    ) -> tuple[list[list[Tensor]], float]:
        """Each worker's fresh gradient (per param) on its own batch, and the mean loss."""
        if len(batches) != self.world_size:
            raise ValueError(f"need one batch per worker: got {len(batches)}, W={self.world_size}")
        grads, losses = zip(
            *(self._worker_grad(w, batch, loss_fn) for w, batch in enumerate(batches)), strict=True
        )
        return list(grads), sum(losses) / len(losses)

    def _worker_grad(self, worker: int, batch: Any, loss_fn: LossFn) -> tuple[list[Tensor], float]:
        """Worker ``worker``'s gradient. Every replica is the one model here; a reading whose
        replicas drift loads the worker's own before computing."""
        return self._grad_on(batch, loss_fn)

    def _grad_on(self, batch: Any, loss_fn: LossFn) -> tuple[list[Tensor], float]:
        """The gradient (per param; zeros where none flows) and loss of the model as it is now
        on one batch; ``.grad`` is left cleared."""
        for p in self.params:
            p.grad = None
        loss = loss_fn(self.model, batch)
        loss.backward()
        grads = [
            p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in self.params
        ]
        for p in self.params:
            p.grad = None
        return grads, float(loss.detach())

    def step(
        self, batches: Sequence[Any], loss_fn: LossFn, *, lr: float | None = None
    ) -> StepResult:
        lr = self.hp.lr if lr is None else lr
        grads, loss = self.worker_grads(batches, loss_fn)
        if self.method == "scape":
            return self._scape_step(grads, loss, lr)
        return self._dense_step(grads, loss, lr)

    def _dense_step(self, grads: list[list[Tensor]], loss: float, lr: float) -> StepResult:
        W, inv = self.world_size, 1.0 / self.world_size
        for i, p in enumerate(self.params):
            acc = grads[0][i] * inv
            for w in range(1, W):
                acc = acc + grads[w][i] * inv
            p.grad = acc
        norm = torch.sqrt(
            sum(
                (p.grad.double().square().sum() for p in self.params),
                torch.zeros((), dtype=torch.float64, device=self.device),
            )
        ).float()
        n = sum(p.numel() for p in self.params)
        size = self.params[0].element_size()
        bytes_ = {
            GRAD_VALUES: ring_bytes_per_rank(n * size, W),
            PARAM_VALUES: ring_bytes_per_rank(n * size, W),
            SCALARS: 2 * ring_bytes_per_rank(4, W),
        }
        self.step_count += 1
        if not torch.isfinite(norm):
            for p in self.params:
                p.grad = None
            return StepResult(self.step_count, loss, float(norm), True, bytes_)
        coeff = clip_coefficient(norm, self.hp.clip_grad)
        if coeff is not None:
            for p in self.params:
                p.grad.mul_(coeff)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for p in self.params:
            p.grad = None
        return StepResult(self.step_count, loss, float(norm), False, bytes_)

    def _flat_grads(self, grads: list[list[Tensor]]) -> Tensor:
        flat = torch.zeros(self.world_size, self.layout.total, device=self.device)
        for w, per_param in enumerate(grads):
            for g, off in zip(per_param, self.layout.param_offsets, strict=True):
                flat[w, off : off + g.numel()] = g.view(-1)
        return flat

    def bytes_per_step(self, dense: bool, k: int | None = None) -> dict[str, float]:
        """Per rank: the all-reduce of each bucket's values and its finite flag (booked as its
        reduce-scatter and all-gather halves) and the all-gather of the step's masks (one byte
        per selected coefficient), ``k`` per chunk (None: the step's now)."""
        size = torch.empty((), dtype=WIRE_DTYPES[self.scape.value_dtype]).element_size()
        per_shard = [
            self.layout.shard_size(b) if dense
            else basis.num_selected if k is None
            else selected_count(self.layout.shard_size(b), self.scape.chunk, k)
            for b, basis in enumerate(self.bases)
        ]  # fmt: skip
        return step_bytes_per_rank(per_shard, self.world_size, size, masks=not dense)

    def run_bytes(self, steps: int) -> float:
        """Bytes per rank of a SCAPE run's first ``steps`` steps, every kind: what its steps'
        byte records sum to (the dense warm-up, then each step's k), without running them.
        (A step after a skipped one sends at its masks' k, the skipped step's, so a run with
        skips mid-ramp books a little more.)"""
        cfg = self.scape
        return sum(
            sum(self.bytes_per_step(t <= cfg.dense_warmup_steps, cfg.k_at(t)).values())
            for t in range(1, steps + 1)
        )

    def _scape_step(self, grads: list[list[Tensor]], loss: float, lr: float) -> StepResult:
        cfg, W, hp = self.scape, self.world_size, self.hp
        t = self.step_count + 1
        self.step_count = t
        fresh = self._flat_grads(grads)
        dense = t <= cfg.dense_warmup_steps or self.masks is None
        k_now = cfg.k if dense else self.mask_k  # the k its masks were made for
        if cfg.ramp_start_k:  # ... and the schedule's for the masks made now
            for steps in self.steps:
                for step in steps:
                    step.set_k(k_now, cfg.k_at(t + 1))
            self.bases = [step.basis for step in self.steps[0]]
        bytes_ = self.bytes_per_step(dense)
        wire_dtype = WIRE_DTYPES[cfg.value_dtype]
        spans = [slice(start, end) for start, end in self.layout.buckets]
        # From the last warm-up step on, every owner makes its shard's mask for the next step.
        new_masks = None
        if t >= cfg.dense_warmup_steps:
            new_masks = [torch.empty(W, step.next_num_selected, dtype=torch.int64,
                                     device=self.device) for step in self.steps[0]]  # fmt: skip
        synced = []
        for b, span in enumerate(spans):
            masks = None if dense else self.masks[b]
            payloads = []
            for w in range(W):
                step = self.steps[w][b]
                if step.payload_is_grad(dense):  # reduced in place, as the adapter's buffer
                    payload = fresh[w, span]
                else:
                    payload = torch.empty(step.payload_numel(dense), dtype=wire_dtype,
                                          device=self.device)  # fmt: skip
                step.pack(self.moment[w, span], fresh[w, span], masks, payload,
                          next_mask=None if new_masks is None else new_masks[b][w])  # fmt: skip
                payloads.append(payload)
            total = payloads[0]
            for w in range(1, W):
                total = total + payloads[w]  # the all-reduce, in rank order and the wire dtype
            synced.append(total)
        # Any rank's non-finite gradient makes every rank skip: its flag (inf) travels in the
        # sum, as in the adapter. Nothing is committed, so the next step starts from intact
        # moments.
        if not all(bool(all_finite(s)) for s in synced):
            return StepResult(t, loss, float("nan"), True, bytes_)
        synced = [self.steps[0][b].values(s, dense) for b, s in enumerate(synced)]
        self.updates += 1
        norm, clip = step_clip(synced, hp.clip_grad, self.implementation)  # ||q||, unclipped
        for b, span in enumerate(spans):
            masks = None if dense else self.masks[b]
            update = Update(
                param=self.flat_param[span],
                second_moment=None if self.second_moment is None else self.second_moment[span],
                param_out=None, decay_factor=1.0 - lr * hp.weight_decay, lr=lr,
                step=self.updates, clip=clip,
            )  # fmt: skip
            for w in range(W):  # every worker commits its moment; the params step once
                self.steps[w][b].finish(
                    self.moment[w, span], fresh[w, span], masks, synced[b],
                    update=update if w == 0 else None,
                    next_mask=None if new_masks is None else new_masks[b][w],
                )  # fmt: skip
        self.last_used_masks = None if dense else self.masks
        self.last_synced = synced  # the summed buffers every rank stepped with (last_q)
        overlap = None
        if new_masks is not None:
            if self.last_used_masks is not None and k_now == cfg.k_at(t + 1):
                overlap = _overlap(self.bases, self.last_used_masks, new_masks)
            self.masks, self.mask_k = new_masks, cfg.k_at(t + 1)
        return StepResult(t, loss, float(norm), False, bytes_, mask_overlap=overlap,
                          moment_norm=float(self.moment.norm()))  # fmt: skip


def _overlap(bases: list[ShardBasis], before: list[Tensor], after: list[Tensor]) -> float:
    """Fraction of selected (chunk, offset) pairs kept from one mask to the next, compared
    chunk by chunk (a mask holds offsets within chunks, so equal offsets in different chunks
    are different coefficients)."""
    kept = total = 0
    for basis, a, b in zip(bases, before, after, strict=True):
        n_head = basis.full * basis.k
        parts = [(a[..., :n_head].reshape(*a.shape[:-1], basis.full, basis.k),
                  b[..., :n_head].reshape(*b.shape[:-1], basis.full, basis.k)),
                 (a[..., n_head:].unsqueeze(-2), b[..., n_head:].unsqueeze(-2))]  # fmt: skip
        for pa, pb in parts:
            kept += int((pa.unsqueeze(-1) == pb.unsqueeze(-2)).any(-1).sum())
        total += b.numel()
    return kept / total


# ---------------------------------------------------------------- checkpoints
_SKIP = object()  # a simulator attribute construction fixes: not in a checkpoint
_OPTIMIZER = "__optimizer_state__"


def _snapshot(value: Any) -> Any:
    """A copy of one simulator attribute that training may change (tensors, numbers, lists of
    them, a torch optimizer's state), or :data:`_SKIP` (the model, bases, configs: what
    construction fixes)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.optim.Optimizer):
        return {_OPTIMIZER: copy.deepcopy(value.state_dict())}
    if isinstance(value, (list, tuple)):
        items = [_snapshot(v) for v in value]
        return _SKIP if any(i is _SKIP for i in items) else items
    return _SKIP


def _restore(current: Any, saved: Any) -> Any:
    """``saved`` put back where ``current`` is: tensors of the same shape and dtype are copied
    in place, so the views of them (the params of SCAPE's flat buffer) stay bound."""
    if isinstance(saved, dict) and _OPTIMIZER in saved:
        current.load_state_dict(saved[_OPTIMIZER])
        return current
    same = isinstance(current, Tensor) and isinstance(saved, Tensor)
    if same and current.shape == saved.shape and current.dtype == saved.dtype:
        return current.copy_(saved)
    pairs = isinstance(saved, list) and isinstance(current, (list, tuple))
    if pairs and len(current) == len(saved):
        return type(current)(_restore(c, v) for c, v in zip(current, saved, strict=True))
    return saved


def simulator_state(sim: Simulator) -> dict[str, Any]:
    """Every attribute of ``sim`` (any simulator class) that training changes, copied."""
    state = {k: _snapshot(v) for k, v in vars(sim).items() if k not in ("model", "params")}
    return {k: v for k, v in state.items() if v is not _SKIP}


def load_simulator_state(sim: Simulator, state: dict[str, Any]) -> None:
    """Put :func:`simulator_state`'s copy back into a simulator built the same way."""
    for name, saved in state.items():
        setattr(sim, name, _restore(getattr(sim, name, None), saved))
