"""Typed configuration of the quality study (registered in Hydra's ConfigStore by the stage).

A study is a grid: models (one scale preset) x optimizer variants x seeds. Everything that
fixes a run's numbers lives in :class:`RunSpec`, and a run's id is derived from it, so a
finished run is found again (and skipped) only when nothing that matters has changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from scape.adams import AdamHParams
from scape.config import (
    ScapeConfig,
    coefficients_per_chunk,
    density_of,
    ramp_fields,
    ramp_steps_for,
)

METHODS = ("adamw", "adams", "scape", "reading")
PATHS = ("study", "product")  # ScaleConfig.path
# scale settings a run's fingerprint leaves out at these values (added after runs were stored)
DEFAULTS_UNHASHED = (("device", "cpu"), ("path", "study"))

__all__ = [
    "ModelSpec",
    "QualityStudyConfig",
    "RunSpec",
    "ScaleConfig",
    "VariantSpec",
]


@dataclass
class ModelSpec:
    """A Megatron GPTModel shape; the vocabulary comes from the prepared data."""

    name: str = MISSING
    family: str = MISSING  # "gpt" (LayerNorm, GeLU, tied) or "llama" (RMSNorm, SwiGLU, RoPE)
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 256
    num_query_groups: int | None = None  # None: multi-head attention


@dataclass
class _ScaleShape:
    name: str = MISSING
    models: list[ModelSpec] = field(default_factory=list)
    world_size: int = 4
    batch_per_worker: int = 4  # sequences per worker per step
    seq_length: int = 64
    steps: int = 300
    warmup_steps: int = 20  # linear lr warm-up, then cosine to min_lr
    eval_interval: int = 50  # validation loss every this many steps (and at the end)
    val_max_sequences: int | None = None  # curve points on this many (None: all); final: all


# Bases listed last come first in the fields (and in `--cfg job`): the shape, then the shared
# hyper-parameters, then the device.
@dataclass
class ScaleConfig(AdamHParams, _ScaleShape):
    """How big and how long: the part of a study that the machine's budget decides, with the
    optimizer hyper-parameters every arm shares (:class:`scape.adams.AdamHParams`; each
    preset under conf/quality/scale/ sets its own lr and min_lr)."""

    device: str = "cpu"  # "cuda" runs the model and the simulator's state on the GPU
    # "study": the verdict's runs (the simulator's contiguous parameter layout, the study's
    # schedule lr_at, one micro-batch per worker). "product": what a user's
    # `train.engine=simulator` pretrain run does with these settings (Megatron DDP's bucket
    # layout, Megatron's lr scheduler, the pretrain stage's micro-batch size), to measure
    # whether the verdict carries over to it.
    path: str = "study"

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"scale.path={self.path!r}: use one of {', '.join(PATHS)}")


@dataclass
class VariantSpec:
    """One optimizer setting.

    ``method``: ``adamw`` / ``adams`` (dense references), ``scape`` (the library's step,
    ``options`` are :class:`scape.config.ScapeConfig` fields) or ``reading`` (a study-only
    reading of the abstract, ``options`` are :class:`pipelines.studies.readings.ReadingConfig`
    fields). Either way the options say ``sparsity`` (0.99: 1% of the values sent), never the
    code's ``k`` per chunk or ``density``: :meth:`run_options` converts. ``core`` variants run
    with every seed of the study, the others with ``ablation_seeds``.
    """

    method: str = MISSING
    core: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # legend / table text; the variant's key when empty
    # Run at the lr the study chose for this other variant (same model and horizon, its grid
    # closed) instead of the study's lr grid: a variant that changes one thing of another
    # (the bf16 wire of SCAPE) is compared with it at its lr, paired by seed.
    lr_of: str = ""
    # The clip norm of this variant's runs when not the scale's ``clip_grad`` (0: no
    # clipping): the clipping policy's effect, each arm against itself with it.
    clip_grad: float | None = None

    def __post_init__(self) -> None:
        if self.clip_grad is not None and self.clip_grad < 0:
            raise ValueError(f"clip_grad={self.clip_grad}: use 0 (no clipping) or a norm > 0")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}: use one of {', '.join(METHODS)}")
        if self.method in ("adamw", "adams") and self.options:
            raise ValueError(f"the dense method {self.method!r} takes no options")
        for key in ("k", "density"):
            if key in self.options:
                raise ValueError(
                    f"options.{key}={self.options[key]}: write options.sparsity instead "
                    "(0.99 = 1% of the values sent; chunks of `chunk` entries, 0: the whole shard)"
                )

    def run_options(self) -> dict[str, Any]:
        """The options as the code takes them: ``sparsity`` turned into ``k`` per chunk (or,
        for whole-shard readings, ``chunk: 0``, into ``k: 0`` and a ``density``). Run
        fingerprints hash these, so runs stored before options said ``sparsity`` match."""
        options = dict(self.options)
        if self.method not in ("scape", "reading") or "sparsity" not in options:
            return options
        sparsity = options.pop("sparsity")
        if self.method == "scape":
            chunk = options.get("chunk", ScapeConfig.chunk)
        else:
            from pipelines.studies.readings import ReadingConfig  # torch: only when needed

            chunk = options.get("chunk", ReadingConfig.chunk)
        if chunk == 0:  # a reading's whole-shard mask: k follows from the shard's size
            return {**options, "k": 0, "density": density_of(sparsity)}
        if self.method == "scape":  # a density ramp's start, as a count too
            options = ramp_fields(options)
        return {**options, "k": coefficients_per_chunk(sparsity, chunk)}

    def scape_config(self) -> ScapeConfig | None:
        """The library's config of a ``scape`` variant (None for every other method)."""
        if self.method != "scape":
            return None
        options = self.run_options()
        if "ramp_fraction" in options:
            raise ValueError(
                f"options.ramp_fraction={options['ramp_fraction']}: a share of the run, so the "
                "config exists per run (RunSpec(...).variant.scape_config())"
            )
        return ScapeConfig(**options)

    def exchanged_density(self) -> float:
        """Fraction of values exchanged per step once any density ramp is over (1 for the
        dense methods)."""
        options = self.run_options()
        if self.method == "scape":
            ramp = ("ramp_start_k", "ramp_steps", "ramp_fraction")
            cfg = ScapeConfig(**{k: v for k, v in options.items() if k not in ramp})
            return 1.0 if cfg.dense_warmup_steps >= 10**6 else cfg.density
        if self.method == "reading":
            chunk, k = options.get("chunk", 64), options.get("k", 1)
            if chunk == 0 or k == 0:
                return options.get("density", 0.01)
            return k / chunk
        return 1.0


@dataclass
class ReadingRow:
    """One row of the report's opening table: a reading of the abstract, its 90% and 99%
    variants, what travels and what each rank does, and which of the abstract's sentences
    (C1-C5, results/quality/README.md) it keeps and how."""

    name: str = MISSING
    variants: list[str] = field(default_factory=list)  # [90%, 99%]
    what: str = ""
    abstract: str = ""


@dataclass
class QualityStudyConfig:
    quick: bool = False  # the minutes-long version: quick_scale, quick_variants, quick_seeds
    data_dir: str = "data/enwiki_sample__bytebpe1k"
    out_dir: str = "results/quality"
    cache_dir: str = "outputs/quality_cache"  # Megatron GPTDataset index cache
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    variants: dict[str, VariantSpec] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    # Each run's lr and min_lr are the scale's times each of these (the lr grid).
    lr_scales: list[float] = field(default_factory=lambda: [1.0])
    # Close the grids: while a core variant's chosen lr (lowest mean final loss over its
    # seeds) sits at an edge of its grid, run the next point out (x0.5 or x2) on every seed,
    # at most this many times per cell (0: run the grid as given).
    close_grids: int = 0
    ablation_seeds: list[int] = field(default_factory=lambda: [0])
    # Restrict a study to some models / variants (empty: all); the report still reads all runs.
    only_models: list[str] = field(default_factory=list)
    only_variants: list[str] = field(default_factory=list)
    # The readings carried to the 3-seed, 3-horizon comparison (the report's finalist table
    # and gap-vs-steps figure show them).
    finalists: list[str] = field(default_factory=list)
    overview: list[ReadingRow] = field(default_factory=list)  # the report's opening table
    report_only: bool = False  # true: only rewrite the report from the finished runs
    # true: replay one run per (model, variant) of every other code version under out_dir
    # with this code (pipelines.studies.replay), then write the report
    replay: bool = False
    replay_dir: str = "outputs/quality_replay"  # the replays' own runs, per code version
    # wall seconds between a run's checkpoints (0: at every logged step); an interrupted run
    # resumes from its last one, bit for bit (quality_run.train_run)
    checkpoint_seconds: float = 300.0
    report: bool = True  # write summary, plots after the runs
    # true: each run's final record also carries the whole test split's loss
    # (final_test_loss): lr is still chosen on validation, gaps can be read on test
    final_test: bool = False
    quick_scale: ScaleConfig = field(default_factory=ScaleConfig)
    quick_variants: list[str] = field(default_factory=list)
    quick_seeds: list[int] = field(default_factory=lambda: [0])
    quick_out_dir: str = "outputs/quality_quick"

    def __post_init__(self) -> None:
        if self.checkpoint_seconds < 0:
            raise ValueError(f"checkpoint_seconds={self.checkpoint_seconds}: use 0 (at every "
                             "logged step) or more")  # fmt: skip


@dataclass(frozen=True)
class RunSpec:
    """Everything that fixes one run's numbers."""

    model: ModelSpec
    variant_name: str
    variant: VariantSpec
    seed: int
    scale: ScaleConfig
    data_dir: str
    lr_scale: float = 1.0

    def __post_init__(self) -> None:
        # a variant's own clip norm is a setting of its runs: it replaces the scale's here, so
        # the run, its header's settings and its fingerprint all carry it
        if self.variant.clip_grad is not None:
            object.__setattr__(self, "scale", replace(self.scale, clip_grad=self.variant.clip_grad))
        # a density ramp written as a share of the run (the study's option) is the library's
        # ramp_steps at this run's length, so its header and fingerprint carry the steps
        if "ramp_fraction" in self.variant.options:
            options = dict(self.variant.options)
            options["ramp_steps"] = ramp_steps_for(options.pop("ramp_fraction"), self.scale.steps)
            object.__setattr__(self, "variant", replace(self.variant, options=options))

    @property
    def run_id(self) -> str:
        lr = "" if self.lr_scale == 1.0 else f"__lr{self.lr_scale:g}"
        return f"{self.model.name}__{self.variant_name}__s{self.seed}__t{self.scale.steps}{lr}"

    def fingerprint(self) -> str:
        """Hash of the settings (not of labels or paths), stored in the run's header."""
        payload = {
            "model": asdict(self.model),
            "variant": {"method": self.variant.method, "options": self.variant.run_options()},
            "seed": self.seed,
            "data": Path(self.data_dir).name,  # the prepared dataset's <corpus>__<tokenizer>
            "scale": {
                # clip_grad under the name it had when the stored runs were made
                ("max_grad_norm" if k == "clip_grad" else k): v
                for k, v in asdict(self.scale).items()
                # the device and the path only when not their defaults, so runs made before
                # them keep their fingerprints
                if k not in ("name", "models") and (k, v) not in DEFAULTS_UNHASHED
            },
        }
        if self.lr_scale != 1.0:
            payload["lr_scale"] = self.lr_scale
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
