"""Study-only readings of SCAPE's abstract (the reconstruction search), on the W-worker simulator.

Each reading is a different answer to "what exactly travels and what does each rank do with
it", kept consistent with the abstract's five sentences (C1-C5, results/quality/README.md).
They share the simulator's model and parameter bookkeeping and replace only its step:

  owner   R0/R1/R4/R5: the owner of each shard keeps the global first moment m of its shard
          (ZeRO-style) in a chunked basis (identity: R0, R1, R4; DCT: R5); masked entries of
          the mean gradient are reduce-scattered to it; off the mask the owner freezes
          (R0, R4, R5) or every rank estimates (R1: replicated m).
  local   R2/R6: every rank keeps its own first moment over all entries (m_r <- b m_r + g_r),
          the owner of each chunk picks the top-k coefficients of its own m_r (chunked DCT,
          or identity for R2), every rank sends its m_r at that shared mask into ONE
          mean-reduce and removes what it sent; every rank decodes the same buffer q and
          steps with it (sign, a second moment rebuilt from q, Adam or AdamS on q).
  stale   R3: the owner updates its whole shard every step (mean gradient on the mask, its
          own local gradient off it) and only masked parameters are sent, so the other
          replicas are stale by a bounded age.
  dgc     not a reading: the DGC-style peer (scape/peers/dgc.py) on the same simulator, so
          SCAPE can be compared with it at the study's horizons. Every rank keeps its own
          accumulated gradient (momentum correction, error feedback), sends its own top-k
          entries per shard with their indices (all-gathered), and every rank applies the
          same dense AdamS to the mean of what arrived.

Flat buffers are padded so every shard is a whole number of chunks: shard j of the single
bucket is [j*S, (j+1)*S), S = n_chunks_per_shard * C, and chunk i belongs to shard i // (S/C).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from scape.adams import adams_update_
from scape.basis import dct_matrix
from scape.comm import GRAD_VALUES, MASKS, PARAM_VALUES, SCALARS, ring_bytes_per_rank
from scape.layout import FlatLayout
from scape.peers.dgc import accumulate_and_select_, num_selected
from scape.simulate import Simulator, StepResult, clip_coefficient

__all__ = [
    "READINGS",
    "ChunkBasis",
    "DGCSimulator",
    "LocalMomentSimulator",
    "OwnerMomentSimulator",
    "ReadingConfig",
    "StaleReplicaSimulator",
    "build_reading_simulator",
]

READINGS = ("owner", "local", "stale", "dgc")
UPDATES = ("sign", "rms", "adam", "adams", "adams_coef")


class ChunkBasis:
    """A flat vector read as chunks of C entries, each in the DCT (or identity) basis."""

    def __init__(self, kind: str, chunk: int) -> None:
        if kind not in ("dct", "identity"):
            raise ValueError(f"basis={kind!r}: use dct or identity")
        self.kind, self.chunk = kind, chunk
        self.matrix = dct_matrix(chunk) if kind == "dct" else None

    def forward(self, x: Tensor) -> Tensor:
        """(..., n*C) -> (..., n, C) coefficients."""
        chunks = x.reshape(*x.shape[:-1], -1, self.chunk)
        return chunks if self.matrix is None else chunks @ self.matrix.T

    def inverse(self, coefs: Tensor) -> Tensor:
        """(..., n, C) -> (..., n*C)."""
        x = coefs if self.matrix is None else coefs @ self.matrix
        return x.reshape(*coefs.shape[:-2], -1)


@dataclass(frozen=True)
class ReadingConfig:
    """One reading and its options (fields a reading does not use are ignored).

    chunk: entries per chunk (0: the whole shard, identity basis only); k: coefficients
    selected per chunk (0: ceil(density * chunk)).
    """

    reading: str = "local"
    basis: str = "dct"
    chunk: int = 64
    k: int = 1
    density: float = 0.01  # used when k == 0
    dense_warmup_steps: int = 1
    delay_mask: bool = True
    # local (R2/R6)
    local_beta: float = 0.999
    # sign | rms | adam | adams | adams_coef (AdamS per DCT coefficient: its m and denominator
    # kept in the chunked basis, the step decoded to entries)
    update: str = "rms"
    v_beta: float = 0.95  # the rebuilt second moment's EMA
    mask_owner: str = "owner"  # owner (one mask per chunk) | per_rank (DeMo proper)
    # chunk: k per chunk; shard: the owner's k/C * S largest coefficients of its whole shard
    # (uneven per chunk, so every index travels as a 2-byte in-shard offset)
    scope: str = "chunk"
    local_clip: bool = False  # clip each rank's fresh gradient by its own norm
    # owner (R0/R1/R4/R5)
    statistic: str = "momentum"  # momentum | raw_gradient
    error_feedback: bool = False
    off_mask: str = "freeze"  # freeze | zero | stale | decay  (the last three: R1)
    off_mask_scale: float = 1.0  # R1: the off-mask step is scaled by this
    off_mask_max_age: int = 0  # R1: no off-mask step after this many steps unsent (0: none)
    age_step: str = "none"  # R4: none | linear | sqrt (step scaled by the entry's wait)
    age_cap: int = 100
    # stale (R3)
    age_weight: float = 0.1
    # dgc: DGC's momentum correction u <- mc * u + g before accumulation (0: none)
    momentum_correction: float = 0.9

    def __post_init__(self) -> None:
        if self.reading not in READINGS:
            raise ValueError(f"reading={self.reading!r}: use one of {', '.join(READINGS)}")
        if self.update not in UPDATES:
            raise ValueError(f"update={self.update!r}: use one of {', '.join(UPDATES)}")
        if self.off_mask not in ("freeze", "zero", "stale", "decay"):
            raise ValueError(f"off_mask={self.off_mask!r}")
        if self.age_step not in ("none", "linear", "sqrt"):
            raise ValueError(f"age_step={self.age_step!r}")
        if self.dense_warmup_steps < 0:
            raise ValueError("dense_warmup_steps must be >= 0")
        if self.mask_owner not in ("owner", "per_rank"):
            raise ValueError(f"mask_owner={self.mask_owner!r}")
        if self.scope not in ("chunk", "shard"):
            raise ValueError(f"scope={self.scope!r}: use chunk or shard")
        if not 0.0 <= self.momentum_correction < 1.0:
            raise ValueError(f"momentum_correction={self.momentum_correction} must be in [0, 1)")


class _ChunkedSimulator(Simulator):
    """Simulator state over a flat buffer padded to whole chunks per shard."""

    def __init__(self, model, world_size, *, hparams, reading: ReadingConfig, **kw) -> None:
        self.reading = reading
        super().__init__(model, world_size, method="scape", hparams=hparams, **kw)

    def _init_scape(self, layout: FlatLayout | None) -> None:
        W, r = self.world_size, self.reading
        numels = [p.numel() for p in self.params]
        n = sum(numels)
        if r.chunk == 0:
            if r.basis != "identity":
                raise ValueError("chunk=0 (whole shard) needs basis=identity")
            chunk = math.ceil(n / W)
        else:
            chunk = r.chunk
        total = math.ceil(n / (W * chunk)) * W * chunk
        offsets = [sum(numels[:i]) for i in range(len(numels))]
        self.bind_flat_params(FlatLayout(tuple(offsets), tuple(numels), ((0, total),), total, W))
        self.basis = ChunkBasis(r.basis, chunk)
        self.n_chunks = total // chunk
        self.chunks_per_shard = self.n_chunks // W
        self.k = r.k if r.k > 0 else num_selected(chunk, r.density)
        if not 1 <= self.k <= chunk:
            raise ValueError(f"k={self.k} must be in [1, chunk={chunk}]")
        self.owner_of_chunk = torch.arange(self.n_chunks) // self.chunks_per_shard
        self.mask_idx: Tensor | None = None  # (n_chunks, k) or (W, n_chunks, k)

    @property
    def density(self) -> float:
        return self.k / self.basis.chunk

    def _decay_params(self, lr: float) -> None:
        if self.hp.weight_decay:
            self.flat_param[self.decay_mask] *= 1.0 - lr * self.hp.weight_decay

    def _index_bytes(self) -> float:
        """Bytes of one mask index within a chunk (bit-packed)."""
        return max(1, math.ceil(math.log2(self.basis.chunk))) / 8

    def _shared_bytes(self, dense: bool) -> dict[str, float]:
        """One mean-reduce of the masked values (reduce-scatter + all-gather) and the masks."""
        W, total = self.world_size, self.layout.total
        n_values = total if dense else self.n_chunks * self.k
        return {
            GRAD_VALUES: ring_bytes_per_rank(n_values * 4, W),
            PARAM_VALUES: ring_bytes_per_rank(n_values * 4, W),
            MASKS: 0.0 if dense else ring_bytes_per_rank(n_values * self._index_bytes(), W),
            SCALARS: 2 * ring_bytes_per_rank(8, W),
        }

    def _topk_per_chunk(self, coefs: Tensor) -> Tensor:
        """(..., n_chunks, C) -> (..., n_chunks, k) indices of the largest |coefficients|."""
        return coefs.abs().topk(self.k, dim=-1, sorted=False).indices

    def _owner_rows(self, per_rank: Tensor) -> Tensor:
        """(W, n_chunks, ...) -> (n_chunks, ...): each chunk's row from its owner."""
        return per_rank[self.owner_of_chunk, torch.arange(self.n_chunks)]


class LocalMomentSimulator(_ChunkedSimulator):
    """R2 (identity basis) and R6 (DCT basis): local first moments, one shared sparse buffer."""

    def _init_scape(self, layout: FlatLayout | None) -> None:
        super()._init_scape(layout)
        total, W = self.layout.total, self.world_size
        self.local_m = torch.zeros(W, total)
        self.v = torch.zeros(total)  # the second moment rebuilt from the shared buffer
        self.global_m = torch.zeros(total)  # adam / adams on the buffer
        self.update_count = 0

    def _select(self) -> Tensor:
        coefs = self.basis.forward(self.local_m)  # (W, n_chunks, C)
        if self.reading.scope == "shard":  # a boolean (n_chunks, C) mask, uneven per chunk
            own = self._owner_rows(coefs).abs().view(self.world_size, -1)  # (W, S) per shard
            keep = own.shape[1] * self.k // self.basis.chunk
            chosen = torch.zeros_like(own, dtype=torch.bool)
            chosen.scatter_(-1, own.topk(keep, dim=-1).indices, True)
            return chosen.view(self.n_chunks, -1)
        if self.reading.mask_owner == "per_rank":
            return self._topk_per_chunk(coefs)
        return self._topk_per_chunk(self._owner_rows(coefs))

    def _scape_step(self, grads, loss: float, lr: float) -> StepResult:
        r, W, hp = self.reading, self.world_size, self.hp
        t = self.step_count + 1
        self.step_count = t
        fresh = self._flat_grads(grads)
        mean_norm = float(fresh.mean(0).norm())
        if not bool(torch.isfinite(fresh).all()):
            return StepResult(t, loss, float("nan"), True, self._shared_bytes(False))
        if r.local_clip and hp.clip_grad:
            norms = fresh.norm(dim=1, keepdim=True)
            fresh = fresh * (hp.clip_grad / (norms + 1e-6)).clamp(max=1.0)
        self.local_m.mul_(r.local_beta).add_(fresh)
        dense = t <= r.dense_warmup_steps
        if dense:
            q = self.local_m.mean(0)
            self.local_m.zero_()
            bytes_ = self._shared_bytes(True)
        else:
            if self.mask_idx is None or not r.delay_mask:
                self.mask_idx = self._select()
            coefs = self.basis.forward(self.local_m)  # (W, n_chunks, C)
            idx = self.mask_idx
            if idx.dtype == torch.bool:
                sent = coefs * idx
            else:
                if idx.dim() == 2:
                    idx = idx.unsqueeze(0).expand(W, -1, -1)
                sent = torch.zeros_like(coefs).scatter_(-1, idx, coefs.gather(-1, idx))
            self.local_m.sub_(self.basis.inverse(sent))
            q = self.basis.inverse(sent.mean(0))
            bytes_ = self._shared_bytes(False)
            if r.mask_owner == "per_rank":  # every rank's values and indices, all-gathered
                n_values = W * self.n_chunks * self.k
                bytes_[GRAD_VALUES] = ring_bytes_per_rank(n_values * 4, W)
                bytes_[PARAM_VALUES] = 0.0
                bytes_[MASKS] = ring_bytes_per_rank(n_values * self._index_bytes(), W)
            if r.scope == "shard":  # 2-byte in-shard offsets (offset16) instead of in-chunk ones
                bytes_[MASKS] = ring_bytes_per_rank(self.n_chunks * self.k * 2, W)
        self._decay_params(lr)
        self._apply(q, lr)
        if not dense and r.delay_mask:
            self.mask_idx = self._select()
        elif dense and t == r.dense_warmup_steps:
            self.mask_idx = self._select() if r.delay_mask else None
        return StepResult(t, loss, mean_norm, False, bytes_)

    def _apply(self, q: Tensor, lr: float) -> None:
        r, hp = self.reading, self.hp
        self.update_count += 1
        n = self.update_count
        beta1, eps = hp.betas[0], hp.eps
        if r.update == "sign":
            self.flat_param.add_(q.sign(), alpha=-lr)
        elif r.update == "rms":
            self.v.mul_(r.v_beta).addcmul_(q, q, value=1.0 - r.v_beta)
            denom = (self.v / (1.0 - r.v_beta**n)).sqrt_().add_(eps)
            self.flat_param.addcdiv_(q, denom, value=-lr)
        elif r.update == "adam":
            self.global_m.mul_(beta1).add_(q, alpha=1.0 - beta1)
            self.v.mul_(r.v_beta).addcmul_(q, q, value=1.0 - r.v_beta)
            denom = (self.v / (1.0 - r.v_beta**n)).sqrt_().add_(eps)
            self.flat_param.addcdiv_(self.global_m, denom, value=-lr / (1.0 - beta1**n))
        elif r.update == "adams_coef":  # the same rule per coefficient of the chunked basis
            step_coefs = torch.zeros(self.n_chunks, self.basis.chunk)
            adams_update_(
                step_coefs, self.global_m.view(self.n_chunks, -1), self.basis.forward(q),
                step=n, lr=1.0, beta1=beta1, beta2=r.v_beta, eps=eps,
            )  # fmt: skip
            self.flat_param.add_(self.basis.inverse(step_coefs), alpha=lr)
        else:  # adams: AdamS's own rule, its denominator from the previous m and q
            adams_update_(
                self.flat_param, self.global_m, q, step=n, lr=lr,
                beta1=beta1, beta2=r.v_beta, eps=eps,
            )  # fmt: skip


class OwnerMomentSimulator(_ChunkedSimulator):
    """R0 / R4 / R5 (frozen off the mask) and R1 (replicated m, estimated off the mask).

    m and the residuals live in the chunked basis; the update is decoded to parameters.
    """

    def _init_scape(self, layout: FlatLayout | None) -> None:
        super()._init_scape(layout)
        shape = (self.n_chunks, self.basis.chunk)
        self.m = torch.zeros(shape)
        self.res = torch.zeros(self.world_size, *shape)
        self.age_c = torch.zeros(shape, dtype=torch.int64)

    def _select(self, local_accum: Tensor) -> Tensor:
        if self.reading.statistic == "raw_gradient":  # owner's own accumulated gradient
            return self._topk_per_chunk(self._owner_rows(local_accum))
        return self._topk_per_chunk(self.m)

    def _scape_step(self, grads, loss: float, lr: float) -> StepResult:
        r, W, hp = self.reading, self.world_size, self.hp
        t = self.step_count + 1
        self.step_count = t
        fresh = self.basis.forward(self._flat_grads(grads))  # (W, n_chunks, C)
        dense = t <= r.dense_warmup_steps
        bytes_ = self._shared_bytes(dense)
        if not bool(torch.isfinite(fresh).all()):
            return StepResult(t, loss, float("nan"), True, bytes_)
        accum = self.res + fresh
        if dense:
            idx = torch.arange(self.basis.chunk).expand(self.n_chunks, -1)
        else:
            if self.mask_idx is None or not r.delay_mask:
                self.mask_idx = self._select(accum)
            idx = self.mask_idx
        synced = accum.gather(-1, idx.expand(W, -1, -1)).mean(0)  # (n_chunks, k')
        norm = synced.double().square().sum().sqrt().float()
        coeff = clip_coefficient(norm, hp.clip_grad)
        if coeff is not None:
            synced = synced * coeff
        if r.error_feedback:
            self.res = accum.scatter_(-1, idx.expand(W, -1, -1), 0.0)
        self._decay_params(lr)
        step_coefs = self._masked_adams(idx, synced, t, dense)
        self.flat_param.add_(self.basis.inverse(step_coefs), alpha=-lr)
        self.age_c.add_(1).scatter_(-1, idx, 0)
        if not dense and r.delay_mask:
            self.mask_idx = self._select(self.res)
        return StepResult(t, loss, float(norm), False, bytes_)

    def _masked_adams(self, idx: Tensor, synced: Tensor, t: int, dense: bool) -> Tensor:
        """AdamS's direction in the chunked basis (zero off the mask unless R1)."""
        r, hp = self.reading, self.hp
        beta1, beta2, eps = hp.betas[0], hp.betas[1], hp.eps
        if r.off_mask == "freeze" or dense:
            ages = self.age_c.gather(-1, idx)  # steps since last sent, before this step
            m_sel = self.m.gather(-1, idx)
            direction = torch.zeros_like(m_sel)
            adams_update_(direction, m_sel, synced, step=t, lr=1.0,
                          beta1=beta1, beta2=beta2, eps=eps)  # fmt: skip
            direction.neg_()  # adams_update_ subtracts lr * step from its param
            if r.age_step != "none" and not dense:
                waited = (ages + 1).clamp(max=r.age_cap).float()
                direction.mul_(waited if r.age_step == "linear" else waited.sqrt())
            self.m.scatter_(-1, idx, m_sel)
            return torch.zeros_like(self.m).scatter_(-1, idx, direction)
        # R1: every rank holds the whole m and estimates the gradient off the mask.
        on = torch.zeros_like(self.m, dtype=torch.bool).scatter_(-1, idx, True)
        if r.off_mask == "zero":
            estimate = torch.zeros_like(self.m)
        elif r.off_mask == "stale":
            estimate = self.m.clone()
        else:  # decay: the stale m, shrunk as if the gradient faded
            estimate = self.m * beta1
        estimate.scatter_(-1, idx, synced)
        direction = torch.zeros_like(self.m)
        adams_update_(direction, self.m, estimate, step=t, lr=1.0,
                      beta1=beta1, beta2=beta2, eps=eps)  # fmt: skip
        direction.neg_()
        off_scale = torch.full_like(self.m, r.off_mask_scale)
        if r.off_mask_max_age > 0:
            off_scale[self.age_c >= r.off_mask_max_age] = 0.0
        return torch.where(on, direction, direction * off_scale)


class StaleReplicaSimulator(_ChunkedSimulator):
    """R3: the owner updates its whole shard every step; replicas are synced at the mask.

    Identity basis, per-shard masks of |m| (mean-normalized) + age_weight * age, so no
    replica entry stays stale for long. Each worker's forward runs on its own replica.
    """

    def _init_scape(self, layout: FlatLayout | None) -> None:
        super()._init_scape(layout)
        if self.reading.basis != "identity":
            raise ValueError("the stale-replica reading works in the identity basis")
        total = self.layout.total
        self.replicas = self.flat_param.unsqueeze(0).repeat(self.world_size, 1)
        self.m = torch.zeros(total)
        self.age = torch.zeros(total, dtype=torch.int64)
        self.max_staleness = 0
        self.replica_gap = 0.0

    def worker_grads(self, batches, loss_fn):
        """Each worker's gradient, computed on its own (partly stale) replica."""
        result = super().worker_grads(batches, loss_fn)
        self.flat_param.copy_(self._owner_view())  # evaluation sees the owners' values
        return result

    def _worker_grad(self, worker: int, batch, loss_fn) -> tuple[list[Tensor], float]:
        self.flat_param.copy_(self.replicas[worker])
        return self._grad_on(batch, loss_fn)

    def _owner_view(self) -> Tensor:
        S = self.layout.total // self.world_size
        return torch.cat([self.replicas[j, j * S : (j + 1) * S] for j in range(self.world_size)])

    def _select(self) -> Tensor:
        score = self.m.abs().view(self.n_chunks, -1)
        score = score / score.mean(-1, keepdim=True).clamp_min(1e-30)
        score = score + self.reading.age_weight * self.age.view(self.n_chunks, -1).float()
        return self._topk_per_chunk(score)

    def _scape_step(self, grads, loss: float, lr: float) -> StepResult:
        r, W, hp = self.reading, self.world_size, self.hp
        t = self.step_count + 1
        self.step_count = t
        fresh = self._flat_grads(grads).view(W, self.n_chunks, -1)
        dense = t <= r.dense_warmup_steps
        bytes_ = self._shared_bytes(dense)
        if not bool(torch.isfinite(fresh).all()):
            return StepResult(t, loss, float("nan"), True, bytes_)
        if dense:
            idx = torch.arange(self.basis.chunk).expand(self.n_chunks, -1)
        else:
            if self.mask_idx is None:
                self.mask_idx = self._select()
            idx = self.mask_idx
        synced = fresh.gather(-1, idx.expand(W, -1, -1)).mean(0)
        # Each owner's estimate of its shard: the mean on the mask, its own gradient off it.
        estimate = self._owner_rows(fresh).clone().scatter_(-1, idx, synced)
        norm = estimate.double().square().sum().sqrt().float()
        coeff = clip_coefficient(norm, hp.clip_grad)
        if coeff is not None:
            estimate = estimate * coeff
        owner = self._owner_view().view(self.n_chunks, -1)
        decay = self.decay_mask.view(self.n_chunks, -1)
        if hp.weight_decay:
            owner = torch.where(decay, owner * (1.0 - lr * hp.weight_decay), owner)
        m = self.m.view(self.n_chunks, -1)
        adams_update_(owner, m, estimate, step=t, lr=lr, beta1=hp.betas[0],
                      beta2=hp.betas[1], eps=hp.eps)  # fmt: skip
        S = self.layout.total // W
        flat_owner = owner.reshape(-1)
        sent = torch.zeros(self.n_chunks, self.basis.chunk, dtype=torch.bool)
        sent.scatter_(-1, idx, True)
        sent = sent.reshape(-1)
        for w in range(W):
            mine = torch.zeros_like(sent)
            mine[w * S : (w + 1) * S] = True
            self.replicas[w] = torch.where(mine | sent, flat_owner, self.replicas[w])
        self.age.add_(1)
        self.age[sent] = 0
        self.max_staleness = max(self.max_staleness, int(self.age.max()))
        ref = flat_owner.norm()
        self.replica_gap = float((self.replicas - flat_owner).norm(dim=1).max() / ref)
        self.flat_param.copy_(flat_owner)
        if not dense:
            self.mask_idx = self._select()
        return StepResult(t, loss, float(norm), False, bytes_)


class DGCSimulator(_ChunkedSimulator):
    """DGC-style top-k of each rank's own accumulated gradient (the peer baseline of
    scape/peers/dgc.py: its own accumulate_and_select_, called per shard here, per bucket there):

        u_r <- mc * u_r + g_r;  v_r <- v_r + u_r          (v_r <- v_r + g_r when mc = 0)
        I_r = top-k |v_r| per shard;  all-gather (I_r as int32, v_r[I_r])
        g = sum_r scatter(I_r, v_r[I_r]) / W;  v_r[I_r] = 0, u_r[I_r] = 0
        clip g, dense AdamS with it on every rank (identical replicas, no param all-gather)

    Identity basis, chunk 0 (one chunk per shard)."""

    def _init_scape(self, layout: FlatLayout | None) -> None:
        super()._init_scape(layout)
        if self.reading.basis != "identity":
            raise ValueError("the DGC peer works in the identity basis (basis=identity)")
        total, W = self.layout.total, self.world_size
        # the corrected momentum; none to keep without momentum correction
        self.u = torch.zeros(W, total) if self.reading.momentum_correction else None
        self.v = torch.zeros(W, total)  # accumulated, not yet sent
        self.m = torch.zeros(total)  # AdamS's first moment, the same on every rank

    def _dgc_bytes(self, dense: bool) -> dict[str, float]:
        W = self.world_size
        if dense:  # the warm-up step: a plain mean-reduce of every entry
            return self._shared_bytes(True)
        n_values = W * self.n_chunks * self.k  # every rank's selection, all-gathered
        return {
            GRAD_VALUES: ring_bytes_per_rank(n_values * 4, W),
            PARAM_VALUES: 0.0,
            MASKS: ring_bytes_per_rank(n_values * 4, W),  # int32 indices, as the hook sends
            SCALARS: 0.0,
        }

    def _scape_step(self, grads, loss: float, lr: float) -> StepResult:
        r, W, hp = self.reading, self.world_size, self.hp
        t = self.step_count + 1
        self.step_count = t
        fresh = self._flat_grads(grads)  # (W, total)
        dense = t <= r.dense_warmup_steps
        bytes_ = self._dgc_bytes(dense)
        if not bool(torch.isfinite(fresh).all()):
            return StepResult(t, loss, float("nan"), True, bytes_)
        shape = (W, self.n_chunks, -1)
        v = self.v.view(shape)
        u = None if self.u is None else self.u.view(shape)
        # The dense warm-up sends every entry: the same rule with k = the whole shard.
        k = v.shape[-1] if dense else self.k
        idx, picked = accumulate_and_select_(
            v, u, fresh.view(shape), r.momentum_correction, k, torch.float32
        )  # (W, n_chunks, k) each
        g = torch.zeros_like(v).scatter_(-1, idx, picked).mean(0).view(-1)
        norm = g.double().square().sum().sqrt().float()
        coeff = clip_coefficient(norm, hp.clip_grad)
        if coeff is not None:
            g = g * coeff
        self._decay_params(lr)
        adams_update_(self.flat_param, self.m, g, step=t, lr=lr, beta1=hp.betas[0],
                      beta2=hp.betas[1], eps=hp.eps)  # fmt: skip
        return StepResult(t, loss, float(norm), False, bytes_)


def build_reading_simulator(model, world_size: int, hparams, reading: ReadingConfig) -> Simulator:
    cls = {
        "local": LocalMomentSimulator,
        "owner": OwnerMomentSimulator,
        "stale": StaleReplicaSimulator,
        "dgc": DGCSimulator,
    }[reading.reading]
    return cls(model, world_size, hparams=hparams, reading=reading)
