"""AdamS: Adam without a second-moment buffer (arXiv 2505.16363).

The rule, per step t (1-based), in the order of the authors' reference code:

    p      = p * (1 - lr * wd)                                   # decoupled weight decay
    m_hat  = m_{t-1} / (1 - beta1^t)
    denom  = sqrt(beta2 * m_hat^2 + (1 - beta2) * g_t^2) + eps
    m_t    = beta1 * m_{t-1} + (1 - beta1) * g_t
    p      = p - lr * (m_t / (1 - beta1^t)) / denom

The denominator needs only ``m_{t-1}`` and ``g_t``, no second-moment buffer. AdamS is the
dense baseline SCAPE is compared with (the simulator's and Megatron's dense arms step with
:class:`AdamS`); SCAPE's own update is :mod:`scape.shard`'s.

:func:`adams_update_` is the rule. :class:`AdamS` runs it per tensor, over lists with
multi-tensor (foreach) kernels, or on CUDA as one fused Triton kernel per tensor
(:func:`scape.fused.adams_fused_`: one read of p, m, g and one write of p, m), chosen by
device as ``torch.optim`` chooses (``foreach`` / ``fused`` None). The foreach path is
bit-identical to the per-tensor one; the fused one agrees to fp32 rounding (tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

__all__ = [
    "AdamHParams",
    "AdamS",
    "adams_update_",
    "adams_update_foreach_",
    "apply_weight_decay_",
]


@dataclass
class AdamHParams:
    """The hyper-parameters AdamW, AdamS and SCAPE share, defined here once.

    The Megatron adapter's ``OptimizerSpec``, the pretrain stage's ``OptimizerConfig`` and the
    quality study's ``ScaleConfig`` extend this class instead of spelling the fields again
    (``tests/test_hparams_once.py`` checks). Not frozen: Hydra's structured configs extend
    it and must stay writable. Defaults: GPT-2's under Megatron (AdamW's, per the AdamS paper).
    """

    lr: float = 6e-4  # peak learning rate, after warm-up
    min_lr: float = 6e-5  # where the cosine decay ends
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # decoupled; Megatron's groups exempt biases and norms
    clip_grad: float = 1.0  # max global gradient norm; 0 turns clipping off

    @property
    def betas(self) -> tuple[float, float]:
        return (self.beta1, self.beta2)

    def shared(self) -> dict[str, float]:
        """These fields of any config that extends this class, as keyword arguments for
        another one (e.g. the pretrain stage's ``OptimizerConfig`` -> ``OptimizerSpec``)."""
        return {f.name: getattr(self, f.name) for f in fields(AdamHParams)}


def apply_weight_decay_(param: Tensor, *, lr: float, weight_decay: float) -> None:
    """Decoupled weight decay, ``p *= 1 - lr * wd``; a no-op when ``wd == 0``.

    SCAPE applies it to *all* entries on every rank (it is a scalar every replica knows),
    then the masked update with ``weight_decay=0``; for the updated entries this is the
    same sequence of floating-point operations as the dense rule.
    """
    if weight_decay != 0.0:
        param.mul_(1.0 - lr * weight_decay)


def adams_update_(
    param: Tensor,
    exp_avg: Tensor,
    grad: Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float = 0.0,
) -> None:
    """One AdamS step, in place on ``param`` and ``exp_avg`` (same shape as ``grad``).

    ``step`` is the 1-based step number used for bias correction.
    """
    if step < 1:
        raise ValueError(f"step must be >= 1 (1-based bias correction), got {step}")
    apply_weight_decay_(param, lr=lr, weight_decay=weight_decay)
    bias_correction = 1.0 - beta1**step
    denom = torch.div(exp_avg, bias_correction).square_().mul_(beta2)
    denom.addcmul_(grad, grad, value=1.0 - beta2).sqrt_().add_(eps)
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    param.addcdiv_(exp_avg, denom, value=-lr / bias_correction)


def adams_update_foreach_(
    params: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    grads: Sequence[Tensor],
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float = 0.0,
) -> None:
    """The same rule as :func:`adams_update_` over lists, with multi-tensor kernels.

    Each foreach kernel applies the single-tensor kernel's arithmetic per tensor, so the
    results are bit-identical to calling :func:`adams_update_` in a loop (tested).
    """
    if step < 1:
        raise ValueError(f"step must be >= 1 (1-based bias correction), got {step}")
    if not params:
        return
    if weight_decay != 0.0:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    bias_correction = 1.0 - beta1**step
    denoms = torch._foreach_div(exp_avgs, bias_correction)
    torch._foreach_mul_(denoms, denoms)
    torch._foreach_mul_(denoms, beta2)
    torch._foreach_addcmul_(denoms, grads, grads, value=1.0 - beta2)
    torch._foreach_sqrt_(denoms)
    torch._foreach_add_(denoms, eps)
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-lr / bias_correction)


class AdamS(torch.optim.Optimizer):
    """AdamS as a ``torch.optim.Optimizer``: one state tensor per param, ``exp_avg``.

    Hyper-parameters are AdamW's (the authors use AdamW's recipe unchanged); weight decay
    is decoupled and may differ per parameter group.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate {lr!r}: must be >= 0")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid betas {betas!r}: each must be in [0, 1)")
        if not eps >= 0.0:
            raise ValueError(f"Invalid eps {eps!r}: must be >= 0")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay {weight_decay!r}: must be >= 0")
        if fused and foreach:
            raise ValueError("AdamS: fused=True and foreach=True are exclusive; set one")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach,
                        fused=fused)  # fmt: skip
        super().__init__(params, defaults)

    def _init_group(self, group: dict) -> tuple[list[Tensor], list[Tensor], list[Tensor], list]:
        params, grads, exp_avgs, states = [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("AdamS does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            states.append(state)
        return params, grads, exp_avgs, states

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D401 - torch signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, states = self._init_group(group)
            if not params:
                continue
            beta1, beta2 = group["betas"]
            # All params of a group advance together, so they share one step count;
            # a param that first gets a grad later starts its own count at 1.
            by_step: dict[int, list[int]] = {}
            for i, state in enumerate(states):
                state["step"] += 1
                by_step.setdefault(int(state["step"].item()), []).append(i)
            implementation = _implementation(group, params)
            for step, idx in by_step.items():
                kwargs = dict(
                    step=step,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                )
                if implementation == "fused":
                    from scape.fused import adams_fused_

                    for i in idx:
                        adams_fused_(params[i], exp_avgs[i], grads[i], **kwargs)
                elif implementation == "foreach":
                    adams_update_foreach_(
                        [params[i] for i in idx],
                        [exp_avgs[i] for i in idx],
                        [grads[i] for i in idx],
                        **kwargs,
                    )
                else:
                    for i in idx:
                        adams_update_(params[i], exp_avgs[i], grads[i], **kwargs)
        return loss


def _implementation(group: dict, params: list[Tensor]) -> str:
    """``fused`` (Triton), ``foreach`` or ``single``: the group's choice, else by device as
    torch.optim chooses: fused on CUDA where Triton is installed, foreach on other
    accelerators, single tensors on the CPU."""
    fused, foreach = group.get("fused"), group.get("foreach")
    on_cuda = all(p.device.type == "cuda" for p in params)
    if fused:
        if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "AdamS(fused=True) runs a Triton kernel: CUDA params only (or the CPU under "
                "TRITON_INTERPRET=1); use foreach=True or leave fused=None"
            )
        return "fused"
    if fused is None and foreach is None and on_cuda:
        try:
            import triton  # noqa: F401
        except ImportError:
            return "foreach"
        return "fused"
    if foreach or (foreach is None and all(p.device.type != "cpu" for p in params)):
        return "foreach"
    return "single"
