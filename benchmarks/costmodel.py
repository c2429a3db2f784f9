"""Alpha-beta cost model of ring collectives: the formula and its fit to timed collectives.

A ring reduce-scatter (input T bytes) or all-gather (output T bytes) over W ranks takes
W-1 steps; in each a rank sends T/W bytes to its neighbour:

    t(T, W) = (W - 1) * alpha + (W - 1) / W * T / B

alpha: per-step latency (software + network); B: the bandwidth one rank gets for sending
(each link is full duplex, so a ring's sends and receives do not compete). What a step's
collectives cost, and what of it hides behind compute, is worked out where the step is
modeled: :func:`benchmarks.megatron_step.predict` (the emulated rounds) and
:mod:`benchmarks.projection` (the paper's cluster).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AlphaBeta", "fit_alpha_beta", "ring_time"]


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float  # seconds per ring step
    bandwidth_Bps: float  # bytes per second one rank sends

    def to_dict(self) -> dict[str, float]:
        return {"alpha_us": self.alpha_s * 1e6, "bandwidth_MBps": self.bandwidth_Bps / 1e6}

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> AlphaBeta:
        """The inverse of :meth:`to_dict` (a fit as the benchmark JSON stores it)."""
        return cls(d["alpha_us"] * 1e-6, d["bandwidth_MBps"] * 1e6)


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
