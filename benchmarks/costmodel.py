"""Alpha-beta cost model of ring collectives, fitted and used to predict step times.

A ring reduce-scatter (input T bytes) or all-gather (output T bytes) over W ranks takes
W-1 steps; in each a rank sends T/W bytes to its neighbour:

    t(T, W) = (W - 1) * alpha + (W - 1) / W * T / B

alpha: per-step latency (software + network); B: the bandwidth one rank gets for sending
(each link is full duplex, so a ring's sends and receives do not compete). A step then
costs its measured compute and local optimizer work plus the collectives it issues:
one reduce-scatter of gradient values, one all-gather of parameter values, and (SCAPE)
one all-gather of masks, hidden behind compute when the mask is delayed by a step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["AlphaBeta", "StepCost", "fit_alpha_beta", "predict_step", "ring_time"]


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float  # seconds per ring step
    bandwidth_Bps: float  # bytes per second one rank sends

    def to_dict(self) -> dict[str, float]:
        return {"alpha_us": self.alpha_s * 1e6, "bandwidth_MBps": self.bandwidth_Bps / 1e6}


def ring_time(total_nbytes: float, world_size: int, link: AlphaBeta) -> float:
    """Seconds of one ring reduce-scatter (input) / all-gather (output) of ``total_nbytes``."""
    if world_size <= 1 or total_nbytes <= 0:
        return 0.0
    steps = world_size - 1
    return steps * link.alpha_s + steps / world_size * total_nbytes / link.bandwidth_Bps


def fit_alpha_beta(points: Iterable[tuple[int, float, float]]) -> AlphaBeta:
    """Least squares of ``t = (W-1) alpha + x / B`` with x = (W-1)/W * T, over (W, T, t).

    Two unknowns, solved from the 2x2 normal equations; alpha is clipped at 0 (a negative
    intercept only means latency is below what the noise resolves).
    """
    rows = [(w - 1.0, (w - 1.0) / w * nbytes, t) for w, nbytes, t in points]
    if len(rows) < 2:
        raise ValueError("need at least two measurements to fit alpha and beta")
    saa = sum(a * a for a, _, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sat = sum(a * t for a, _, t in rows)
    sbt = sum(b * t for _, b, t in rows)
    det = saa * sbb - sab * sab
    if det <= 0:
        raise ValueError("measurements do not separate latency from bandwidth")
    alpha = (sat * sbb - sbt * sab) / det
    inv_b = (saa * sbt - sab * sat) / det
    if alpha < 0:  # refit the slope through the origin
        alpha, inv_b = 0.0, sbt / sbb
    if inv_b <= 0:
        raise ValueError("fitted bandwidth is not positive")
    return AlphaBeta(alpha, 1.0 / inv_b)


@dataclass(frozen=True)
class StepCost:
    """A predicted step, by part (seconds)."""

    compute: float
    local: float  # optimizer-side work: pack, update, selection, encode/decode, unpack
    grad_sync: float
    param_sync: float
    mask_exposed: float

    @property
    def total(self) -> float:
        return self.compute + self.local + self.grad_sync + self.param_sync + self.mask_exposed

    def to_dict(self) -> dict[str, float]:
        return {**self.__dict__, "total": self.total}


def predict_step(
    *,
    world_size: int,
    compute_s: float,
    local_s: float,
    bytes_per_rank: Mapping[str, float],
    reduce_scatter: AlphaBeta,
    all_gather: AlphaBeta,
    mask_overlapped: bool = True,
    mask_collectives: int = 1,
) -> StepCost:
    """Step time from measured compute/local work and the per-rank bytes of each kind.

    ``bytes_per_rank`` uses the communicator's ring accounting ((W-1)/W of the collective's
    size), so the collective's size is recovered as bytes * W / (W-1). A mask exchange that
    overlaps compute costs only what sticks out beyond the compute it hides behind.
    ``mask_collectives``: the delta encoding sends two (lengths, then payloads).
    """
    w = world_size
    if w <= 1:
        return StepCost(compute_s, local_s, 0.0, 0.0, 0.0)

    def total_of(kind: str) -> float:
        return bytes_per_rank.get(kind, 0.0) * w / (w - 1)

    grad = ring_time(total_of("grad_values"), w, reduce_scatter)
    param = ring_time(total_of("param_values"), w, all_gather)
    mask = 0.0
    if bytes_per_rank.get("masks", 0.0) > 0:
        mask = ring_time(total_of("masks"), w, all_gather) + (mask_collectives - 1) * (
            (w - 1) * all_gather.alpha_s
        )
    exposed = max(0.0, mask - compute_s) if mask_overlapped else mask
    return StepCost(compute_s, local_s, grad, param, exposed)
