"""SCAPE's knobs, validated once at construction.

Only the paper's abstract is public. Every field marked *inferred* is this project's
reconstruction; its default is the one the reconstruction search (issue 13,
results/quality/README.md) settled on. What was chosen and why (small Llama / small GPT,
W = 4, 1,500 steps, val loss; gaps paired against dense AdamS, each at its best lr):

* The reading: R6 (local first moments read in a chunked DCT, one shared all-reduce, every
  rank decodes and steps) replaced R0 (sparse reduce-scatter of masked gradients, masked
  AdamS on the owner, frozen entries off the mask): at 99% sparsity R0 trails dense AdamS by
  +32% (Llama) / +14% (GPT) over 3 seeds even at its own best lr (x4 / x8), the library step by
  +6.3% / +1.8%, and by +2.5% / +3.1% at 3,000 steps (R0's gap grows with training,
  R6's shrinks on Llama). At 90% the library step is within 1% at 1,500 steps
  (-0.9% / -4.7%, each at its best lr), R0 +14% / +0.3%. At 300 steps every
  reading that freezes or estimates unsent entries (R0, R1, R3, R4, R5) is at least +13%
  (Llama, 99%) behind. DGC-style top-k on the same simulator, at its own best lr, trails
  by +10.1% / +12.6% at 99% (3 seeds) for 3.4x the library step's bytes.
* update="rms" over "sign": with seed 0 and lr 3e-3 neither wins on both models (rms
  4.207 / 5.003 at 99%, sign 4.420 / 4.844; at 90% rms 4.072 / 4.790, sign 4.129 / 4.490);
  over 3 seeds at 99% the library's sign step trails by +9.5% / +1.5% against rms's +6.3% /
  +1.8% (sign at x1, its best of x0.5-x2), and sign's gap grows from 1,500 to 3,000 steps
  (+9.7% / +5.5%) where rms's shrinks (+2.5% / +3.1%); rms is C4 read closely (a second
  moment rebuilt from the one buffer). On a 2.0M-parameter Llama (1,500 steps, 2 seeds,
  every method at its own best lr there) rms stays ahead: +8.1% against sign's +10.2% (dense
  AdamS 3.762 at x0.125; rms at x0.25, sign at x0.5). Feeding q to AdamS's own rule
  instead trails by +25% (Llama, 99%, 300 steps), and +33% with AdamS per DCT coefficient.
* moment_beta=0.999: the issue's probes (sign step, 1,500 steps: beta 0.9 / 0.95 / 0.99 /
  0.999 gave 4.364 / 4.306 / 4.221 / 4.247; rms step beta 0.999 4.098 vs 0.99 4.143). In
  the study 0.99 helps SCAPE-99 only at the default's lr: at x0.5 it beat 0.999 in all six
  paired seeds (gap +5.2% / +0.0% against +6.3% / +1.8%), but its own lr grid picks x1 on
  Llama (seed 0: 4.229), where seeds 1-2 end at 4.550 / 4.386 (gap +7.7% against +6.3%
  over 3 seeds). At 90% it is no better (seed 0: 4.051 / 4.562 against 4.039 / 4.557).
  Kept at 0.999: one default for both sparsities, and neither beta meets the 99% target on
  Llama. Beta 1 (pure error feedback): 4.325 / 4.796 against 4.299 / 4.928 (seed 0).
* chunk=100: k = 1 or 10 is exactly 99% or 90% of the values, and an offset is one byte
  (chunks of 200 with k = 2, seed 0: 4.292 / 5.060).
* second_moment_beta=0.95: the study's AdamS beta2; 0.99 gave 4.303 / 5.109 (seed 0).
* dense_warmup_steps=1: 75 dense steps (5% of 1,500) gave 4.213 against 4.393 (seed 0,
  lr 3e-3, 99%; at the best lr x0.5: 4.273 vs 4.299 on Llama, 4.763 vs 4.928 on GPT), but
  they send every value for 5% of the run, so the run's average density is 6%, not 1%
  (C5), and one seed does not resolve a few percent (results/quality/README.md, "Noise").
* lr: the library step's best lr at 99% was half the study's 3e-3 on both models (Llama
  x0.25 / x0.5 / x1 / x2: 4.749 / 4.299 / 4.393 / 4.821), as for dense AdamS on Llama.
"""

from __future__ import annotations

from dataclasses import dataclass

from scape.basis import MAX_CHUNK

__all__ = ["UPDATES", "VALUE_DTYPES", "ScapeConfig"]

UPDATES = ("rms", "sign")
VALUE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ScapeConfig:
    """One SCAPE step (the search's reading R6), ``density = k / chunk``.

    chunk, k: every shard is read in chunks of ``chunk`` entries, each in an orthonormal
        DCT basis (inferred: the transform DeMo uses), and k coefficients per chunk travel per
        step. chunk=100: k=1 is 99% sparsity, k=10 is 90%.
    moment_beta: every rank keeps its own first moment of its own gradients over all
        entries, ``m_r <- moment_beta * m_r + g_r``, from which what is sent is removed
        (inferred; at 1 it is pure error feedback).
    update: how every rank turns the decoded synchronized buffer q into a step (inferred):
        ``rms`` divides q by the root of a second moment rebuilt from q itself
        (``v <- b2 v + (1 - b2) q^2``, C4 of the abstract); ``sign`` takes sign(q).
    second_moment_beta: b2 of the rebuilt second moment (``rms`` only).
    dense_warmup_steps: the first steps send every entry (at least one: the moments are
        zero before step 1, so no mask can be made for it).
    value_dtype: dtype of the values on the wire; what a narrower wire rounds away stays in
        the sending rank's moment, so no gradient mass is lost to it.
    fuse_buckets: one all-reduce for all buckets' values after backward, instead of one per
        bucket overlapped with backward (transport only: the numbers are the same).
    """

    chunk: int = 100
    k: int = 1
    moment_beta: float = 0.999
    update: str = "rms"
    second_moment_beta: float = 0.95
    dense_warmup_steps: int = 1
    value_dtype: str = "float32"
    fuse_buckets: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.chunk <= MAX_CHUNK:
            raise ValueError(
                f"ScapeConfig.chunk={self.chunk} must be in [1, {MAX_CHUNK}] "
                "(a mask offset travels as one byte)"
            )
        if not 1 <= self.k <= self.chunk:
            raise ValueError(
                f"ScapeConfig.k={self.k} must be in [1, chunk={self.chunk}]; "
                "density = k / chunk, e.g. k=1 of 100 for 99% sparsity"
            )
        if not 0.0 <= self.moment_beta <= 1.0:
            raise ValueError(f"ScapeConfig.moment_beta={self.moment_beta} must be in [0, 1]")
        if self.update not in UPDATES:
            raise ValueError(f"ScapeConfig.update={self.update!r} is not one of {UPDATES}")
        if not 0.0 <= self.second_moment_beta < 1.0:
            raise ValueError(
                f"ScapeConfig.second_moment_beta={self.second_moment_beta} must be in [0, 1)"
            )
        if self.dense_warmup_steps < 1:
            raise ValueError(
                f"ScapeConfig.dense_warmup_steps={self.dense_warmup_steps} must be >= 1: "
                "the moments are zero before the first step, so its mask cannot be made"
            )
        if self.value_dtype not in VALUE_DTYPES:
            raise ValueError(
                f"ScapeConfig.value_dtype={self.value_dtype!r} is not one of {VALUE_DTYPES}"
            )

    @property
    def density(self) -> float:
        return self.k / self.chunk

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density

    @classmethod
    def for_sparsity(cls, sparsity: float, *, chunk: int = 100, **fields) -> ScapeConfig:
        """The config whose k / chunk is ``1 - sparsity`` exactly; a clear error otherwise."""
        k = round((1.0 - sparsity) * chunk)
        if k < 1 or abs(k / chunk - (1.0 - sparsity)) > 1e-9:
            raise ValueError(
                f"sparsity={sparsity} is not a whole number of coefficients per chunk of "
                f"{chunk}; use a sparsity that is a multiple of 1/{chunk} (e.g. 0.9, 0.99) "
                "or set chunk"
            )
        return cls(chunk=chunk, k=k, **fields)
