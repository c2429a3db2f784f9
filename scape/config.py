"""SCAPE's knobs, validated once at construction.

Only the paper's abstract is public. Every field marked *inferred* is this project's
reconstruction; its default is the one our quality study (results/quality/) settled on.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MASK_ENCODINGS",
    "MASK_STATISTICS",
    "OFF_MASK_MOMENTUM",
    "SELECTIONS",
    "VALUE_DTYPES",
    "ScapeConfig",
]

MASK_STATISTICS = ("momentum", "momentum_residual", "raw_gradient", "random")
SELECTIONS = ("topk", "sampled_threshold")
MASK_ENCODINGS = ("auto", "int32", "offset16", "bitmap")
OFF_MASK_MOMENTUM = ("freeze", "decay")
VALUE_DTYPES = ("float32", "bfloat16")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"ScapeConfig.{name}={value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class ScapeConfig:
    """Configuration of the sparse exchange; ``density = 1 - sparsity``.

    density: fraction of each shard's entries exchanged per step (0.1 = 90% sparsity).
    statistic: what ranks the entries of a shard for the next mask.
        ``momentum`` |m| (the paper's first-moment mask); ``momentum_residual``
        |m| + residual_weight * |owner's local residual| (inferred); ``raw_gradient``
        |owner's accumulated local gradient| (the DGC-style ablation the paper says is
        unstable); ``random`` (ablation).
    age_weight: adds age_weight * (steps since the entry was last sent) to the normalized
        score, so no entry waits forever (inferred; 0 disables).
    selection: ``topk`` exact, or ``sampled_threshold`` (estimate the k-th largest score
        from a random sample, then fix up to exactly k).
    mask_encoding: how masks travel (``auto`` = smallest of the fixed-size encodings).
    delay_mask: use the mask computed at the end of step t-1 at step t, so its all-gather
        overlaps step t's compute (the paper's design). False computes the mask at step t
        after backward and exchanges it before the reduce-scatter (exposed latency); it
        only changes values when the statistic reads the residual.
    error_feedback: keep unsent gradient entries in the buffer (inferred). Off by default:
        in the quality study (results/quality/README.md) dropping them beat keeping them in
        every |m|-mask comparison; with it on, the |m| mask locks onto the same entries.
    off_mask_momentum: what happens to m off the mask: ``freeze`` keeps it (inferred
        default), ``decay`` multiplies it by beta1 as if the gradient there were zero.
    dense_warmup_steps: the first steps exchange everything (at least one: m is zero
        before step 1, so no first-moment mask exists for it).
    value_dtype: dtype of gradient/parameter values on the wire. With error feedback the
        rounding error of the cast stays in the residual.
    seed: for random masks and sampled thresholds (per step and shard, rank-independent).
    """

    density: float = 0.01
    statistic: str = "momentum"
    residual_weight: float = 1.0
    age_weight: float = 0.0
    selection: str = "topk"
    threshold_sample_size: int = 16384
    mask_encoding: str = "auto"
    delay_mask: bool = True
    error_feedback: bool = False
    off_mask_momentum: str = "freeze"
    dense_warmup_steps: int = 1
    value_dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.density <= 1.0:
            raise ValueError(
                f"ScapeConfig.density={self.density!r} must be in (0, 1]; "
                "density = 1 - sparsity, e.g. 0.1 for 90% sparsity"
            )
        _one_of("statistic", self.statistic, MASK_STATISTICS)
        _one_of("selection", self.selection, SELECTIONS)
        _one_of("mask_encoding", self.mask_encoding, MASK_ENCODINGS)
        _one_of("off_mask_momentum", self.off_mask_momentum, OFF_MASK_MOMENTUM)
        _one_of("value_dtype", self.value_dtype, VALUE_DTYPES)
        if self.residual_weight < 0 or self.age_weight < 0:
            raise ValueError("ScapeConfig.residual_weight and age_weight must be >= 0")
        if self.dense_warmup_steps < 1:
            raise ValueError(
                f"ScapeConfig.dense_warmup_steps={self.dense_warmup_steps} must be >= 1: "
                "m is zero before the first step, so the first mask can only come after it"
            )
        if self.threshold_sample_size < 1:
            raise ValueError("ScapeConfig.threshold_sample_size must be >= 1")

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density
