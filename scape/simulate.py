"""W data-parallel workers in one process: the oracle for the distributed code, and the
fast vehicle for quality studies.

All replicas of a data-parallel run hold bit-identical params, so the simulator keeps one
model and runs each worker's forward/backward on it in turn. What differs per worker is
real state: its fresh gradient and (SCAPE) its unsent residual. Owners' state (fp32 params,
``exp_avg``, age) is kept in full-length flat tensors; owner r's state is the slice of its
shard in each bucket. Collectives become sums in rank order.

Methods: ``adamw`` (torch.optim.AdamW) and ``adams`` (scape.AdamS) on the averaged
gradient, the dense references; ``scape`` the sparse step of the reference doc, built from
``scape.shard`` exactly as the Megatron adapter is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from scape.adams import AdamS, apply_weight_decay_
from scape.comm import GRAD_VALUES, MASKS, PARAM_VALUES, SCALARS, ring_bytes_per_rank
from scape.config import ScapeConfig
from scape.encoding import encoded_nbytes
from scape.layout import FlatLayout
from scape.masks import num_selected
from scape.shard import (
    clip_coefficient,
    commit_residual_,
    next_mask,
    owner_update_,
    pack_values,
    update_age_,
)

__all__ = ["METHODS", "OptimizerHParams", "Simulator", "StepResult", "default_decay_filter"]

METHODS = ("adamw", "adams", "scape")
LossFn = Callable[[nn.Module, Any], Tensor]


def default_decay_filter(name: str, param: Tensor) -> bool:
    """Decay matrices, not biases, norms or other vectors (GPT-2 / Megatron convention)."""
    return param.ndim >= 2


@dataclass(frozen=True)
class OptimizerHParams:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    max_grad_norm: float | None = None


@dataclass
class StepResult:
    step: int
    loss: float
    grad_norm: float
    skipped: bool
    bytes: dict[str, float] = field(default_factory=dict)  # per rank, this step, by kind
    mask_overlap: float | None = None  # |M_t ∩ M_{t+1}| / k, averaged over shards
    residual_norm: float | None = None  # norm of all workers' residuals together
    max_age: int | None = None  # steps the oldest unsent entry has waited


class Simulator:
    """Train ``model`` as W data-parallel workers would; ``step`` takes W batches."""

    def __init__(
        self,
        model: nn.Module,
        world_size: int,
        *,
        method: str = "scape",
        hparams: OptimizerHParams = OptimizerHParams(),
        scape: ScapeConfig | None = None,
        layout: FlatLayout | None = None,
        decay_filter: Callable[[str, Tensor], bool] = default_decay_filter,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.model, self.world_size, self.method, self.hp = model, world_size, method, hparams
        self.scape = scape if scape is not None else ScapeConfig()
        self.step_count = 0
        named = list(model.named_parameters())
        self.params = [p for _, p in named]
        self.decays = [decay_filter(n, p) for n, p in named]
        if method == "scape":
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
        W = self.world_size
        self.layout = layout or FlatLayout.contiguous([p.numel() for p in self.params], W)
        if self.layout.world_size != W or len(self.layout.param_offsets) != len(self.params):
            raise ValueError("layout does not match the model's parameters or world size")
        total = self.layout.total
        # Params become views of one flat fp32 buffer, as in Megatron's param buffer.
        self.flat_param = torch.zeros(total)
        for p, off in zip(self.params, self.layout.param_offsets, strict=True):
            self.flat_param[off : off + p.numel()].copy_(p.detach().view(-1))
            p.data = self.flat_param[off : off + p.numel()].view_as(p)
        self.exp_avg = torch.zeros(total)
        self.age = torch.zeros(total, dtype=torch.int32)
        self.residual = torch.zeros(W, total)
        # masks[b][j]: the mask of shard j of bucket b used at the current step (None: dense)
        self.masks: list[list[Tensor]] | None = None
        self.last_used_masks: list[list[Tensor]] | None = None  # for tests and studies
        self.last_sent: Tensor | None = None  # (total,) gradient mass sent at the last step

    def _shard(self, bucket: int, j: int) -> slice:
        start, _ = self.layout.buckets[bucket]
        s = self.layout.shard_size(bucket)
        return slice(start + j * s, start + (j + 1) * s)

    def _shard_id(self, bucket: int, j: int) -> int:
        return bucket * self.world_size + j

    # ---------------------------------------------------------------- one step
    def worker_grads(
        self, batches: Sequence[Any], loss_fn: LossFn
    ) -> tuple[list[list[Tensor]], float]:
        """Each worker's fresh gradient (per param) on its own batch, and the mean loss."""
        if len(batches) != self.world_size:
            raise ValueError(f"need one batch per worker: got {len(batches)}, W={self.world_size}")
        grads, losses = [], []
        for batch in batches:
            for p in self.params:
                p.grad = None
            loss = loss_fn(self.model, batch)
            loss.backward()
            grads.append(
                [
                    p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                    for p in self.params
                ]
            )
            losses.append(float(loss.detach()))
        for p in self.params:
            p.grad = None
        return grads, sum(losses) / len(losses)

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
                torch.zeros((), dtype=torch.float64),
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
        coeff = clip_coefficient(norm, self.hp.max_grad_norm)
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
        flat = torch.zeros(self.world_size, self.layout.total)
        for w, per_param in enumerate(grads):
            for g, off in zip(per_param, self.layout.param_offsets, strict=True):
                flat[w, off : off + g.numel()] = g.view(-1)
        return flat

    def _compute_masks(self, step: int, local_accum: Tensor) -> list[list[Tensor]]:
        """Every owner's mask for ``step``; ``local_accum`` (W, total) is each rank's buffer."""
        return [
            [
                next_mask(
                    self.scape,
                    exp_avg=self.exp_avg[self._shard(b, j)],
                    local_accum=local_accum[j, self._shard(b, j)],
                    age=self.age[self._shard(b, j)],
                    step=step,
                    shard_id=self._shard_id(b, j),
                )
                for j in range(self.world_size)
            ]
            for b in range(len(self.layout.buckets))
        ]

    def _mask_bytes(self) -> float:
        total = 0.0
        for b in range(len(self.layout.buckets)):
            s = self.layout.shard_size(b)
            nbytes = encoded_nbytes(
                s, num_selected(s, self.scape.density), self.scape.mask_encoding
            )
            total += ring_bytes_per_rank(nbytes * self.world_size, self.world_size)
        return total

    def _scape_step(self, grads: list[list[Tensor]], loss: float, lr: float) -> StepResult:
        cfg, W, hp = self.scape, self.world_size, self.hp
        t = self.step_count + 1
        fresh = self._flat_grads(grads)
        dense = t <= cfg.dense_warmup_steps
        bytes_: dict[str, float] = {
            GRAD_VALUES: 0.0,
            PARAM_VALUES: 0.0,
            MASKS: 0.0,
            # The norm scalar travels as float64 so every rank sums it exactly as here.
            SCALARS: 2 * ring_bytes_per_rank(8, W),
        }
        if not dense and (not cfg.delay_mask or self.masks is None):
            # Without the delay the mask is made now, from this step's local buffers, and
            # its exchange sits on the critical path before the reduce-scatter. (With the
            # delay this happens only after a skipped last warm-up step left no mask.)
            self.masks = self._compute_masks(t, self.residual + fresh)
        if not dense:
            bytes_[MASKS] = self._mask_bytes()
        used_masks: list[list[Tensor]] = []
        positions, wires, synced = [], [], []
        for b, (start, _end) in enumerate(self.layout.buckets):
            s = self.layout.shard_size(b)
            masks_b = [torch.arange(s) for _ in range(W)] if dense else self.masks[b]
            used_masks.append(masks_b)
            pos = torch.cat([m + start + j * s for j, m in enumerate(masks_b)])
            wire_w = [
                pack_values(
                    self.residual[w], fresh[w], pos, world_size=W, value_dtype=cfg.value_dtype
                )
                for w in range(W)
            ]
            acc = wire_w[0]
            for w in range(1, W):
                acc = acc + wire_w[w]
            positions.append(pos)
            wires.append(wire_w)
            synced.append(acc.float())
            bytes_[GRAD_VALUES] += ring_bytes_per_rank(acc.numel() * acc.element_size(), W)
            bytes_[PARAM_VALUES] += ring_bytes_per_rank(
                pos.numel() * self.flat_param.element_size(), W
            )

        # Global norm of what was synchronized: each owner's sum of squares, summed in rank order.
        k_of = [m[0].numel() for m in used_masks]
        owner_sq = [
            sum(
                (
                    synced[b][j * k_of[b] : (j + 1) * k_of[b]].double().square().sum()
                    for b in range(len(synced))
                ),
                torch.zeros((), dtype=torch.float64),
            )
            for j in range(W)
        ]
        norm = torch.sqrt(sum(owner_sq[1:], owner_sq[0])).float()
        # An unsent non-finite entry would poison a residual for good: any rank's non-finite
        # fresh gradient makes every rank skip (the adapter folds it into the norm scalar).
        if not bool(torch.isfinite(fresh).all()):
            norm = torch.tensor(float("nan"))
        self.step_count = t
        if not torch.isfinite(norm):
            # Nothing committed: residuals, m, age and masks stay as they were.
            return StepResult(t, loss, float(norm), True, bytes_)
        coeff = clip_coefficient(norm, hp.max_grad_norm)
        self.last_used_masks = used_masks
        # What left the ranks (the sum of their wire values); a bf16 wire also rounds
        # the sum itself, an error no rank holds and error feedback cannot keep.
        self.last_sent = torch.zeros(self.layout.total)
        for pos, wire_w in zip(positions, wires, strict=True):
            self.last_sent[pos] = sum(w.float() for w in wire_w) * W
        for b, (start, end) in enumerate(self.layout.buckets):
            for w in range(W):
                # Per bucket slices: the fresh gradient must be added once, not once per bucket.
                commit_residual_(
                    self.residual[w, start:end],
                    fresh[w, start:end],
                    positions[b] - start,
                    wires[b][w],
                    world_size=W,
                    error_feedback=cfg.error_feedback,
                )
        # Every rank decays all its params locally (a scalar per param group, no traffic).
        for p, decays in zip(self.params, self.decays, strict=True):
            if decays:
                apply_weight_decay_(p.data, lr=lr, weight_decay=hp.weight_decay)
        overlaps = []
        for b in range(len(self.layout.buckets)):
            k = k_of[b]
            for j in range(W):
                shard = self._shard(b, j)
                g = synced[b][j * k : (j + 1) * k]
                if coeff is not None:
                    g = g * coeff
                owner_update_(
                    self.flat_param[shard], self.exp_avg[shard], used_masks[b][j], g,
                    step=t, lr=lr, beta1=hp.betas[0], beta2=hp.betas[1], eps=hp.eps,
                    off_mask_momentum=cfg.off_mask_momentum,
                )  # fmt: skip
                update_age_(self.age[shard], used_masks[b][j])
        if cfg.delay_mask and t >= cfg.dense_warmup_steps:
            new_masks = self._compute_masks(t + 1, self.residual)
            if not dense:
                for b in range(len(new_masks)):
                    for j in range(W):
                        inter = torch.isin(new_masks[b][j], used_masks[b][j]).sum().item()
                        overlaps.append(inter / new_masks[b][j].numel())
            self.masks = new_masks
        elif not cfg.delay_mask and t == cfg.dense_warmup_steps:
            self.masks = None
        return StepResult(
            t,
            loss,
            float(norm),
            False,
            bytes_,
            mask_overlap=sum(overlaps) / len(overlaps) if overlaps else None,
            residual_norm=float(self.residual.norm()),
            max_age=int(self.age.max()),
        )
