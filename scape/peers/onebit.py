"""1-bit-Adam-style compressed momentum as a DDP comm hook, and its optimizer (peer baseline).

Our implementation from the published description of 1-bit Adam (Tang et al., ICML 2021),
not DeepSpeed's code. Adam runs densely for ``freeze_step`` warm-up steps; then the variance
is frozen and what travels is the momentum, sign-compressed (1 bit per entry plus one fp32
scale per chunk) by an error-compensated two-phase all-reduce:

  worker: a = x + e_w, split into W chunks, c_j = sign(a_j) * rms(a_j), e_w = a - c
  phase 1 (all-to-all): rank j receives chunk j from every rank, averages them,
          b = mean + e_s, s = sign(b) * rms(b), e_s = b - s
  phase 2 (all-gather): every rank receives every s_j -> the average, the same on all ranks

The hook keeps a momentum per bucket from the first step (from averaged gradients), so it is
warm at the switch; after the switch the "gradient" DDP writes into ``p.grad`` IS the
averaged momentum, and :class:`OneBitAdam` applies it with the frozen variance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from scape.comm import GRAD_VALUES, SCALARS, ByteCounter, ring_bytes_per_rank
from scape.peers.buckets import ParamBuffers, completed_future, ddp_comm_hook

__all__ = [
    "OneBitAdam",
    "OneBitConfig",
    "OneBitHook",
    "compressed_allreduce",
    "pack_signs",
    "padded_numel",
    "sign_compress",
    "sign_decompress",
    "unpack_signs",
]

_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)  # first entry in the most significant bit


# ----------------------------------------------------------------------------- sign codec
def pack_signs(x: Tensor) -> Tensor:
    """Signs of ``x`` (n,), n a multiple of 8, as (n/8,) uint8; bit set means >= 0 (0 is +)."""
    if x.numel() % 8:
        raise ValueError(f"pack_signs needs a multiple of 8 entries, got {x.numel()}")
    bits = (x.reshape(-1, 8) >= 0).to(torch.uint8)
    return (bits << _SHIFTS.to(x.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: Tensor, n: int) -> Tensor:
    """The first ``n`` signs in ``packed`` (uint8) as (n,) fp32 of +-1."""
    if not 0 <= n <= 8 * packed.numel():
        raise ValueError(f"cannot unpack {n} signs from {packed.numel()} bytes")
    bits = (packed.reshape(-1, 1) >> _SHIFTS.to(packed.device)) & 1  # (bytes, 8)
    return bits.reshape(-1)[:n].to(torch.float32).mul_(2.0).sub_(1.0)


def _rms(chunks: Tensor) -> Tensor:
    """Per-row scale ||x||_2 / sqrt(len) of (rows, len) -> (rows,) fp32."""
    return torch.linalg.vector_norm(chunks.float(), dim=1).div_(math.sqrt(chunks.shape[1]))


def sign_compress(x: Tensor) -> tuple[Tensor, Tensor]:
    """(packed signs (n/8,) uint8, scale () fp32 = ||x||_2 / sqrt(n)); decompresses to scale*sign."""
    return pack_signs(x), _rms(x.reshape(1, -1))[0]


def sign_decompress(packed: Tensor, scale: Tensor, n: int) -> Tensor:
    return unpack_signs(packed, n).mul_(scale)


# ----------------------------------------------------------------------------- all-reduce
def padded_numel(n: int, world_size: int) -> int:
    """Length the all-reduce works on: n rounded up to whole bytes of W equal chunks."""
    return math.ceil(n / (8 * world_size)) * 8 * world_size


def compressed_allreduce(
    x: Tensor,
    worker_error: Tensor,
    server_error: Tensor,
    group: dist.ProcessGroup | None,
    counter: ByteCounter | None,
) -> Tensor:
    """Error-compensated 1-bit average of ``x`` (n,) over ``group``; (n,) fp32, same on all ranks.

    ``worker_error`` (padded_numel(n, W),) and ``server_error`` (padded_numel(n, W) / W,) are
    this rank's fp32 compression errors, updated in place (start them at zero).
    """
    W, rank = dist.get_world_size(group), dist.get_rank(group)
    n, n_pad = x.numel(), padded_numel(x.numel(), W)
    c = n_pad // W  # chunk length, a multiple of 8
    if worker_error.shape != (n_pad,) or server_error.shape != (c,):
        raise ValueError(
            f"errors must be ({n_pad},) and ({c},) for n={n}, W={W}; "
            f"got {tuple(worker_error.shape)} and {tuple(server_error.shape)}"
        )
    # Worker: compress each destination chunk with its own scale, keep what was lost.
    a = worker_error.clone()
    a[:n] += x.reshape(-1)
    scales = _rms(a.view(W, c))  # (W,)
    packed = pack_signs(a)  # (n_pad/8,) = W chunks of c/8 bytes
    worker_error.copy_(a - unpack_signs(packed, n_pad).view(W, c).mul_(scales[:, None]).view(-1))
    worker_error[n:] = 0  # padding carries no signal: keep it from inflating the scales

    # Phase 1: rank j gathers chunk j from every rank and averages it.
    recv = torch.empty_like(packed)
    recv_scales = torch.empty_like(scales)
    if counter is not None:
        counter.add(GRAD_VALUES, ring_bytes_per_rank(packed.numel(), W))
        counter.add(SCALARS, ring_bytes_per_rank(scales.numel() * 4, W))
    dist.all_to_all_single(recv, packed, group=group)
    dist.all_to_all_single(recv_scales, scales, group=group)
    mean = unpack_signs(recv, n_pad).view(W, c).mul_(recv_scales[:, None]).sum(0).div_(W)
    b = mean.add_(server_error)  # (c,)
    s_packed, s_scale = sign_compress(b)
    server_error.copy_(b - sign_decompress(s_packed, s_scale, c))
    server_error[max(0, n - rank * c) :] = 0  # entries of this chunk past n are padding

    # Phase 2: everyone gathers every averaged chunk.
    all_packed = torch.empty(n_pad // 8, dtype=torch.uint8, device=x.device)
    all_scales = torch.empty(W, dtype=torch.float32, device=x.device)
    if counter is not None:
        counter.add(GRAD_VALUES, ring_bytes_per_rank(all_packed.numel(), W))
        counter.add(SCALARS, ring_bytes_per_rank(all_scales.numel() * 4, W))
    dist.all_gather_into_tensor(all_packed, s_packed, group=group)
    dist.all_gather_into_tensor(all_scales, s_scale.reshape(1), group=group)
    out = unpack_signs(all_packed, n_pad).view(W, c).mul_(all_scales[:, None])
    return out.view(-1)[:n]


# ----------------------------------------------------------------------------- hook
@dataclass(frozen=True)
class OneBitConfig:
    freeze_step: int = 100  # dense Adam warm-up steps; then v is frozen, m sign-compressed
    beta1: float = 0.9

    def __post_init__(self) -> None:
        # At least one dense step: the frozen variance must have been estimated.
        if not (isinstance(self.freeze_step, int) and self.freeze_step >= 1):
            raise ValueError(
                f"OneBitConfig.freeze_step must be an int >= 1, got {self.freeze_step!r}"
            )
        if not (isinstance(self.beta1, int | float) and 0.0 <= self.beta1 < 1.0):
            raise ValueError(f"OneBitConfig.beta1 must be in [0, 1), got {self.beta1!r}")


class OneBitHook:
    """State and hook: ``ddp.register_comm_hook(h, OneBitHook.hook)``; pair with :class:`OneBitAdam`.

    ``step`` counts completed optimizer steps; :meth:`OneBitAdam.step` advances it.
    ``params`` (the DDP module's ``parameters()``, in order) is needed to save/load the state.
    """

    def __init__(
        self,
        cfg: OneBitConfig,
        process_group: dist.ProcessGroup | None = None,
        counter: ByteCounter | None = None,
        *,
        params: Iterable[Tensor] | None = None,
    ):
        self.cfg = cfg
        self.process_group = process_group
        self.counter = counter if counter is not None else ByteCounter()
        self.step = 0
        self.momentum = ParamBuffers(("m",), params)  # per parameter, follows re-bucketing
        # Compression errors belong to positions in a bucket's padded layout (and the server
        # error to this rank's chunk of it), so they cannot follow parameters: they are kept
        # per bucket with its layout and dropped (restarted at zero) if the layout changes.
        self._errors: dict[int, tuple[tuple[Hashable, ...], Tensor, Tensor]] = {}

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def _errors_for(self, bucket: dist.GradBucket) -> tuple[Tensor, Tensor]:
        keys, n = self.momentum.keys(bucket), bucket.buffer().numel()
        n_pad = padded_numel(n, self.world_size)
        saved = self._errors.get(bucket.index())
        if saved is None or saved[0] != keys or saved[1].numel() != n_pad:
            device = bucket.buffer().device
            saved = (
                keys,
                torch.zeros(n_pad, dtype=torch.float32, device=device),
                torch.zeros(n_pad // self.world_size, dtype=torch.float32, device=device),
            )
            self._errors[bucket.index()] = saved
        return saved[1], saved[2]

    @staticmethod
    @ddp_comm_hook
    def hook(state: OneBitHook, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        grad = bucket.buffer()  # (n,) this rank's local gradient
        m = state.momentum.get(bucket)["m"]  # (n,) fp32, the same on every rank
        beta1, W = state.cfg.beta1, state.world_size
        if state.step < state.cfg.freeze_step:
            state.counter.add(
                GRAD_VALUES, 2 * ring_bytes_per_rank(grad.numel() * grad.element_size(), W)
            )
            grad.div_(W)  # before the sum, as torch's allreduce_hook does

            def keep_momentum(fut: torch.futures.Future) -> Tensor:
                avg = fut.value()[0]
                m.mul_(beta1).add_(avg, alpha=1.0 - beta1)
                return avg

            work = dist.all_reduce(grad, group=state.process_group, async_op=True)
            return work.get_future().then(keep_momentum)
        worker_error, server_error = state._errors_for(bucket)
        local = m.mul(beta1).add_(grad, alpha=1.0 - beta1)  # (n,) this rank's momentum
        m.copy_(
            compressed_allreduce(
                local, worker_error, server_error, state.process_group, state.counter
            )
        )
        grad.copy_(m)
        return completed_future(grad)

    def state_dict(self) -> dict:
        errors = {}
        if self.momentum.index is not None:  # without stable keys the layout can't be matched
            errors = {
                i: {"keys": list(keys), "worker": we.clone(), "server": se.clone()}
                for i, (keys, we, se) in self._errors.items()
            }
        return {"step": self.step, "momentum": self.momentum.state_dict(), "errors": errors}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.momentum.load_state_dict(state["momentum"])
        self._errors = {
            int(i): (tuple(int(k) for k in e["keys"]), e["worker"].clone(), e["server"].clone())
            for i, e in state["errors"].items()
        }


# ----------------------------------------------------------------------------- optimizer
class OneBitAdam(torch.optim.Optimizer):
    """AdamW during the warm-up; then frozen variance, and ``p.grad`` is the averaged momentum.

    Warm-up (``hook.step < freeze_step``), exactly torch.optim.AdamW's rule:
        p *= 1 - lr*wd;  m, v from p.grad;  p -= lr * m_hat / (sqrt(v_hat) + eps)
    After: v and its bias correction stay as they were at the freeze step, and
        p *= 1 - lr*wd;  p -= lr * p.grad / (sqrt(v_hat) + eps)
    with no bias correction of the momentum (after the warm-up it is ~1).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        hook: OneBitHook,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        mask_unseen: bool = True,
    ):
        if lr < 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if eps <= 0.0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        for group in self.param_groups:
            # The hook's momentum becomes this optimizer's at the freeze: one beta1 for both.
            if group["betas"][0] != hook.cfg.beta1:
                raise ValueError(
                    f"betas[0]={group['betas'][0]} differs from the hook's beta1={hook.cfg.beta1}"
                )
        self.hook = hook
        self.mask_unseen = mask_unseen

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        frozen = self.hook.step >= self.hook.cfg.freeze_step
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0  # dense steps taken: the variance's bias correction
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if wd != 0.0:
                    p.mul_(1.0 - lr * wd)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                if not frozen:
                    state["step"] += 1
                    exp_avg.lerp_(p.grad, 1.0 - beta1)
                    exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                    momentum, step_size = exp_avg, lr / (1.0 - beta1 ** state["step"])
                else:
                    if state["step"] == 0:
                        raise RuntimeError("a parameter got its first gradient after the freeze")
                    momentum, step_size = p.grad, lr
                    if self.mask_unseen:
                        # Sign compression gives every entry the chunk's scale; where the
                        # frozen variance is 0 (e.g. embedding rows of tokens not seen in
                        # the warm-up) that step would be scale/eps. DeepSpeed's 1-bit Adam
                        # masks such rows with `exp_avg_mask`; we mask every entry whose
                        # variance is exactly 0.
                        momentum = momentum * (exp_avg_sq > 0)
                bias_correction2 = 1.0 - beta2 ** state["step"]
                denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
                p.addcdiv_(momentum, denom, value=-step_size)
        self.hook.step += 1
        return loss
