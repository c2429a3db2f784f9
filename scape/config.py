"""SCAPE's knobs, validated once at construction.

Only the paper's abstract is public: every field marked *inferred* is this project's
reconstruction, and its default is the one the reconstruction search (issue 13) settled on.
What was run and what each choice gained is in results/quality/README.md, not here, so that
this file does not go stale with the next run. People write ``sparsity`` (the paper's 90% /
99%): :meth:`ScapeConfig.for_sparsity` is the one converter to the library's ``k`` per
``chunk``, which the arithmetic needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scape.basis import MAX_CHUNK

__all__ = [
    "DEFAULT_SPARSITY",
    "UPDATES",
    "VALUE_DTYPES",
    "ScapeConfig",
    "coefficients_per_chunk",
    "density_of",
    "ramp_fields",
    "ramp_steps_for",
]

UPDATES = ("rms", "sign")
VALUE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ScapeConfig:
    """One SCAPE step (the search's reading R6), ``sparsity = 1 - k / chunk``.

    Per field, why this default (the evidence: results/quality/README.md, the section named):

    chunk, k: every shard is read in chunks of ``chunk`` entries, each in an orthonormal DCT
        basis (inferred: DeMo's transform), and k coefficients per chunk travel per step.
        chunk=100 makes k=1 / k=10 exactly 99% / 90% and an offset one byte ("What was run",
        the library step's options: chunks of 200 were level on Llama, worse on GPT).
    moment_beta: every rank keeps its own first moment of its own gradients,
        ``m_r <- moment_beta * m_r + g_r``, from which what is sent is removed (inferred; 1 is
        pure error feedback). 0.999: one default for both sparsities; 0.99 helped only at
        one lr ("What was run", the library step's options).
    update: how every rank turns the decoded synchronized buffer q into a step (inferred):
        ``rms`` divides q by the root of a second moment rebuilt from q itself
        (``v <- b2 v + (1 - b2) q^2``, C4 of the abstract); ``sign`` takes sign(q). rms: its
        gap shrinks with training where sign's grows ("Finalists").
    second_moment_beta: b2 of the rebuilt second moment (``rms`` only); 0.95 is the dense
        AdamS baseline's beta2 (0.99 was level on Llama, worse on GPT: "What was run").
    dense_warmup_steps: the first steps send every entry; at least one, as the moments are
        zero before step 1 so no mask can be made for it. 1: more warm-up sends every value
        for longer, against C5 ("What was run", the dense warm-up).
    value_dtype: dtype of the values on the wire; what a narrower wire rounds away stays in
        the sending rank's moment, so no gradient mass is lost to it (bytes:
        results/bench/README.md).
    fuse_buckets: one all-reduce for all buckets' values after backward, instead of one per
        bucket overlapped with backward (transport only: the numbers are the same).
    ramp_start_k, ramp_steps: a density ramp, DGC's sparsity warm-up (issue 41's early-gap
        candidate): the first sparse step sends ``ramp_start_k`` coefficients per chunk, and
        k falls exponentially to ``k`` over ``ramp_steps`` sparse steps (:meth:`k_at`).
        0, 0: none, every sparse step sends k ("Early gap": whether it closes the early gap
        within a byte budget). A step sends at the k its masks were made for (after a skipped
        step, the masks it did not use), and makes the next step's at ``k_at(step + 1)``.
    """

    chunk: int = 100
    k: int = 1
    moment_beta: float = 0.999
    update: str = "rms"
    second_moment_beta: float = 0.95
    dense_warmup_steps: int = 1
    value_dtype: str = "float32"
    fuse_buckets: bool = False
    ramp_start_k: int = 0
    ramp_steps: int = 0

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

        if self.ramp_start_k and not self.k < self.ramp_start_k <= self.chunk:
            raise ValueError(
                f"ScapeConfig.ramp_start_k={self.ramp_start_k} must be in (k={self.k}, "
                f"chunk={self.chunk}]: a ramp starts denser than it ends (0: no ramp)"
            )
        if bool(self.ramp_start_k) != (self.ramp_steps > 0) or self.ramp_steps < 0:
            raise ValueError(
                f"ScapeConfig.ramp_steps={self.ramp_steps} with ramp_start_k="
                f"{self.ramp_start_k}: set both (a ramp over >= 1 sparse steps) or neither"
            )

    def k_at(self, step: int) -> int:
        """Coefficients per chunk at (1-based) ``step`` (a dense warm-up step sends every
        entry whatever this says): ``ramp_start_k * (k / ramp_start_k) ** (s / ramp_steps)``
        rounded, for the s-th sparse step (0-based) of the ramp; ``k`` after it."""
        sparse = max(step - self.dense_warmup_steps - 1, 0)
        if not self.ramp_start_k or sparse >= self.ramp_steps:
            return self.k
        k = round(self.ramp_start_k * (self.k / self.ramp_start_k) ** (sparse / self.ramp_steps))
        return min(self.ramp_start_k, max(self.k, k))

    @property
    def k_levels(self) -> tuple[int, ...]:
        """Every k a step of this config can send, ascending."""
        last = self.dense_warmup_steps + 1 + self.ramp_steps
        return tuple(sorted({self.k_at(t) for t in range(1, last + 1)}))

    @property
    def density(self) -> float:
        return self.k / self.chunk

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density

    @classmethod
    def for_sparsity(cls, sparsity: float, *, chunk: int = 100, **fields: Any) -> ScapeConfig:
        """The config whose k / chunk is ``1 - sparsity`` exactly; a clear error otherwise."""
        return cls(chunk=chunk, k=coefficients_per_chunk(sparsity, chunk), **fields)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ScapeConfig:
        """From the fields as a person writes them: ``sparsity`` (default 0.99) in place of
        ``k`` and ``ramp_start_sparsity`` in place of ``ramp_start_k``, every other field
        optional (its default here)."""
        fields = dict(settings)
        for count, person in (("k", "sparsity"), ("ramp_start_k", "ramp_start_sparsity")):
            if count in fields:
                raise ValueError(
                    f"{count}={fields[count]} is the library's count per chunk; write "
                    f"{person}=<1 - {count} / chunk> instead (e.g. {person}=0.99)"
                )
        return cls.for_sparsity(fields.pop("sparsity", DEFAULT_SPARSITY), **ramp_fields(fields))


DEFAULT_SPARSITY = ScapeConfig().sparsity  # 0.99: k=1 of chunk=100


def ramp_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with a person's ``ramp_start_sparsity`` turned into the library's
    ``ramp_start_k`` (per chunk of ``options['chunk']``, default 100)."""
    fields = dict(options)
    if "ramp_start_sparsity" in fields:
        start = fields.pop("ramp_start_sparsity")
        fields["ramp_start_k"] = coefficients_per_chunk(
            start, fields.get("chunk", ScapeConfig.chunk)
        )
    return fields


def ramp_steps_for(fraction: float, train_steps: int) -> int:
    """A density ramp over ``fraction`` of a run of ``train_steps`` as the library's
    ``ramp_steps``: the share rounded to whole steps, at least one. The one conversion the
    pretrain stage and the quality study both use, so a share means the same run in each."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"ramp_fraction={fraction} must be in (0, 1): a share of the run's steps")
    return max(1, round(fraction * train_steps))


def density_of(sparsity: float) -> float:
    """The fraction of values sent, ``1 - sparsity``, rounded to 12 decimals so that
    binary floating point's tail goes (1 - 0.9 is 0.09999999999999998, 0.9 must give 0.1)."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity={sparsity} must be in [0, 1) (0.99 = 1% of values sent)")
    return round(1.0 - sparsity, 12)


def coefficients_per_chunk(sparsity: float, chunk: int) -> int:
    """k, the coefficients sent per chunk, with k / chunk = ``1 - sparsity`` exactly."""
    k = round((1.0 - sparsity) * chunk)
    if k < 1 or abs(k / chunk - (1.0 - sparsity)) > 1e-9:
        raise ValueError(
            f"sparsity={sparsity} is not a whole number of coefficients per chunk of "
            f"{chunk}; use a sparsity that is a multiple of 1/{chunk} (e.g. 0.9, 0.99) "
            "or set chunk"
        )
    return k
