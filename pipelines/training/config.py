"""Typed configuration of the pretrain / evaluate / tables stages.

Plain dataclasses registered in Hydra's ConfigStore (see :func:`register_configs`), so the
YAML under ``conf/`` is type-checked when composed and a misspelt key fails at start-up;
:func:`validate` then checks the rules types cannot express (sparsity range, batch
divisibility, ...) before any work starts. Tests build these dataclasses directly.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import MISSING

from data_prep.config import DataConfig, TokenizerConfig
from scape.adams import AdamHParams
from scape.config import DEFAULT_SPARSITY, ScapeConfig, ramp_steps_for

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "ModelConfig",
    "OneBitOptions",
    "OptimizerConfig",
    "PowerSGDOptions",
    "DGCOptions",
    "PretrainConfig",
    "ScapeSettings",
    "TrainConfig",
    "WandbConfig",
    "compose",
    "register_configs",
    "scape_config",
    "sparsity_of",
    "validate",
]

DENSE = ("adamw", "adams")
PEERS = ("powersgd", "dgc", "onebit")  # issue 8: other ways of cutting communication
OPTIMIZERS = (*DENSE, "scape", *PEERS)
LOCAL_RULES = DENSE  # the update rule PowerSGD and DGC apply to the exchanged gradient
FAMILIES = ("gpt", "llama")
PRECISIONS = ("fp32", "bf16")
LAUNCHERS = ("local", "slurm")
# train.engine: Megatron ranks (one process per rank) or the W-worker simulator in one process
ENGINES = ("megatron", "simulator")
SIMULATED = (*DENSE, "scape")  # what the simulator engine runs
BACKENDS = ("gloo", "nccl")
SCALES = ("tiny", "paper")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and how to fix it."""


@dataclass
class ModelConfig:
    name: str = MISSING
    family: str = MISSING  # gpt | llama
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    ffn_hidden_size: int = MISSING
    # The tokenizer's vocabulary; Megatron pads it to a multiple of 128 (checked at start-up).
    vocab_size: int = MISSING
    seq_length: int = MISSING
    num_query_groups: int | None = None  # None: multi-head attention


def _as_written(
    name: str,
    config: type,
    *,
    field: str,
    written_as: tuple[str, type, object],
    omit: tuple[str, ...] = (),
    extra: tuple[tuple[str, type, object], ...] = (),
) -> type:
    """``config``'s fields and defaults as a Hydra structured config, with ``field`` (the
    library's term) replaced by ``written_as`` (the person's), ``omit`` left out and ``extra``
    added, read off the class itself so that the two cannot drift apart."""
    hints = typing.get_type_hints(config)
    fields = [
        (f.name, hints[f.name], f.default)
        for f in dataclasses.fields(config)
        if f.name != field and f.name not in omit
    ]
    cls = dataclasses.make_dataclass(name, [written_as, *fields, *extra])
    cls.__module__ = __name__  # so that pickle (submitit's jobs) finds it here by name
    return cls


# What optimizer.scape.* is typed by: ScapeConfig's fields (its docstring says what each does
# and which are inferred) with sparsity, the paper's 90% / 99%, in place of k per chunk.
# scape_config() turns it into the library's ScapeConfig. A density ramp is written as the
# sparsity it starts at and the share of train.train_steps it takes (the library counts k and
# steps): ramp_start_sparsity=0.9 ramp_fraction=0.15 is DGC's warm-up as the quality study ran
# it (results/quality/README.md, "The early gap"); None / 0: no ramp.
ScapeSettings = _as_written(
    "ScapeSettings", ScapeConfig, field="k", written_as=("sparsity", float, DEFAULT_SPARSITY),
    omit=("ramp_start_k", "ramp_steps"),
    extra=(("ramp_start_sparsity", float | None, None), ("ramp_fraction", float, 0.0)),
)  # fmt: skip


@dataclass
class PowerSGDOptions:
    """PyTorch's PowerSGD DDP hook (scape.peers.powersgd); read when name=powersgd."""

    rank: int = 1  # matrix_approximation_rank
    start_iter: int = 2  # plain all-reduce before this iteration (torch's minimum with EF)
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    local_rule: str = "adams"  # adams | adamw: the update applied to the decompressed gradient


@dataclass
class DGCOptions:
    """DGC-style top-k of the accumulated gradient (scape.peers.dgc); read when name=dgc."""

    sparsity: float = 0.99
    momentum: float = 0.9  # momentum correction; 0 turns it off
    value_dtype: str = "float32"
    local_rule: str = "adams"
    # DGC's warm-up density schedule (scape.peers.dgc.DGCConfig): the density decays 25% ->
    # 6.25% -> 1.56% -> 0.39% (never below the target) over this many steps; 0: off.
    warmup_steps: int = 0
    # The paper's local gradient clipping: each rank clips its own gradient to this norm over
    # sqrt(W) before accumulating it, in place of clipping the exchanged one (optimizer.
    # clip_grad); 0: off (the exchanged gradient is clipped at optimizer.clip_grad).
    local_clip: float = 0.0
    # The paper's per-layer selection (each tensor's own top fraction) instead of one top-k
    # over the whole DDP bucket (results/peers/dgc_screen/).
    per_tensor: bool = False


@dataclass
class OneBitOptions:
    """1-bit-Adam-style sign compression (scape.peers.onebit); read when name=onebit."""

    freeze_step: int = 50  # dense Adam steps, then frozen variance + 1-bit momentum
    mask_unseen: bool = True  # no update where the frozen variance is 0 (DeepSpeed's exp_avg_mask)


@dataclass
class _OptimizerName:
    name: str = MISSING  # adamw | adams | scape | powersgd | dgc | onebit
    label: str = MISSING  # how tables and plots name it, e.g. "SCAPE-99"


# Bases listed last come first in the fields (and in `--cfg job`): the name, then the shared
# hyper-parameters, then the method's own options.
@dataclass
class OptimizerConfig(AdamHParams, _OptimizerName):
    """The shared hyper-parameters (lr, min_lr, betas, eps, weight_decay, clip_grad: defined
    once in :class:`scape.adams.AdamHParams`) and the method's own options."""

    # The method's lr over the train config's, applied to lr and min_lr alike by
    # :meth:`scaled` and printed at start-up. None: the recipe's ratio to dense AdamS's lr for
    # the model's family (``lr_multiplier_by_family``, conf/optimizer/scape*.yaml;
    # results/quality/README.md, "The recipe"), 1 for a family it does not name; resolved by
    # :func:`validate`. A number set on the command line wins over the family's.
    lr_multiplier: float | None = None
    lr_multiplier_by_family: dict[str, float] = field(default_factory=dict)
    scape: ScapeSettings = field(default_factory=ScapeSettings)  # only read when name=scape
    powersgd: PowerSGDOptions = field(default_factory=PowerSGDOptions)
    dgc: DGCOptions = field(default_factory=DGCOptions)
    onebit: OneBitOptions = field(default_factory=OneBitOptions)

    def scaled(self) -> dict[str, float]:
        """The shared hyper-parameters as the optimizer and lr schedule use them: lr and
        min_lr times ``lr_multiplier`` (resolved by :func:`validate`)."""
        if self.lr_multiplier is None:
            raise ValueError(
                "optimizer.lr_multiplier is unresolved: validate(cfg) sets it from "
                "optimizer.lr_multiplier_by_family for the model's family"
            )
        return {**self.shared(), "lr": self.lr * self.lr_multiplier,
                "min_lr": self.min_lr * self.lr_multiplier}  # fmt: skip


@dataclass
class TrainConfig:
    global_batch_size: int = 8  # sequences per step, all ranks together
    micro_batch_size: int = 2  # sequences per forward/backward on one rank
    train_steps: int = 100
    warmup_steps: int = 10
    lr_decay_style: str = "cosine"  # cosine | constant
    precision: str = "fp32"  # fp32 | bf16 (bf16 needs a GPU)
    eval_interval: int = 25
    eval_iters: int = 4
    log_interval: int = 1
    checkpoint_interval: int = 50
    keep_checkpoints: int = 2
    seed: int = 1234
    bucket_size: int | None = None  # elements per DDP bucket; None = Megatron's default
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    consistency_check_interval: int = 50  # cross-rank checksum of params and masks
    # megatron: one process per rank (cluster.world_size of them); simulator: the quality
    # studies' W workers in one process, on Megatron's layout (pipelines/training/engine.py)
    engine: str = "megatron"


@dataclass
class ClusterConfig:
    name: str = "local"
    launcher: str = "local"  # local: spawned ranks on this machine | slurm: submitit
    nodes: int = 1
    ranks_per_node: int = 2
    gpus_per_node: int = 0  # 0: CPU ranks (gloo)
    backend: str = "gloo"
    partition: str | None = None
    account: str | None = None
    time_minutes: int = 60
    cpus_per_task: int = 1
    max_concurrent: int = 1  # jobs of a sweep running at once
    setup: list[str] = field(default_factory=list)  # shell lines run before each Slurm job
    # A Hugging Face cache on a shared file system, filled on a login node by
    # `python -m pipelines.prefetch`; the Slurm setup lines point HF_HOME at it and turn on
    # offline mode (conf/cluster/vista.yaml). Shell variables are expanded where it is used.
    hf_home: str | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass
class WandbConfig:
    project: str = "scape-repro"
    entity: str | None = None
    # auto: online when WANDB_API_KEY is set, else offline (files under the run directory)
    mode: str = "auto"
    tags: list[str] = field(default_factory=list)


@dataclass
class PretrainConfig:
    experiment: str = "default"
    scale: str = "paper"  # set by conf/scale/: tiny shrinks an experiment to this machine
    sweep: list[str] = field(default_factory=list)  # the optimizer configs the experiment compares
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    data_root: str = "data"  # prepared datasets: <data_root>/<data.name>__<tokenizer.name>
    output_root: str = "runs"  # run directories: <output_root>/<experiment>/<run name>
    run_name: str | None = None  # None: <model>-<optimizer label>-seed<seed>
    dry_run: bool = False  # slurm: write sbatch scripts and resolved configs, submit nothing
    progress: bool = True


def sparsity_of(o: OptimizerConfig) -> float:
    """The fraction of entries a sparse method leaves unsent (0 for dense and low-rank/sign)."""
    if o.name == "scape":
        return float(o.scape.sparsity)
    if o.name == "dgc":
        return float(o.dgc.sparsity)
    return 0.0


def scape_config(o: OptimizerConfig, train_steps: int | None = None) -> ScapeConfig:
    """The library's config of ``optimizer.scape`` for a run of ``train_steps`` (a density
    ramp takes a share of them); None: the steady state after any ramp (what a step sends
    once the ramp is over, for byte formulas). An error names the user's key."""
    settings = dict(vars(o.scape))
    start, fraction = settings.pop("ramp_start_sparsity"), settings.pop("ramp_fraction")
    ramp = start is not None or fraction
    if ramp and (start is None or not 0.0 < fraction < 1.0):
        raise ConfigError(
            f"optimizer.scape.ramp_start_sparsity={start} with ramp_fraction={fraction}: "
            "a density ramp needs both (e.g. 0.9 and 0.15: 90% -> the sparsity over 15% "
            "of train.train_steps); no ramp: ramp_start_sparsity=null ramp_fraction=0"
        )
    if start is not None and train_steps is not None:
        settings["ramp_start_sparsity"] = start
        settings["ramp_steps"] = ramp_steps_for(fraction, train_steps)
    try:
        return ScapeConfig.from_settings(settings)
    except ValueError as err:
        # the library names its own class; the user wrote optimizer.scape.<field>
        raise ConfigError(f"optimizer.scape.{str(err).removeprefix('ScapeConfig.')}") from err


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="pretrain_schema", node=PretrainConfig)


def _fail(key: str, value: object, why: str) -> None:
    raise ConfigError(f"{key}={value!r} {why}")


def validate(cfg: PretrainConfig) -> None:
    """Rules across fields; each error names the key, the bad value and the fix. Resolves
    ``optimizer.lr_multiplier`` when unset (the recipe's value for the model's family)."""
    m, o, t, c = cfg.model, cfg.optimizer, cfg.train, cfg.cluster
    if cfg.scale not in SCALES:
        _fail("scale", cfg.scale, f"is not one of {', '.join(SCALES)}")
    if m.family not in FAMILIES:
        _fail("model.family", m.family, f"is not one of {', '.join(FAMILIES)}")
    if m.hidden_size % m.num_attention_heads:
        _fail(
            "model.hidden_size",
            m.hidden_size,
            f"must be divisible by model.num_attention_heads={m.num_attention_heads}",
        )
    for family, value in o.lr_multiplier_by_family.items():
        if family not in FAMILIES or not value > 0:
            _fail(f"optimizer.lr_multiplier_by_family.{family}", value,
                  f"needs a family in {', '.join(FAMILIES)} and a multiplier > 0")  # fmt: skip
    if o.lr_multiplier is None:  # the recipe's, for this model's family
        o.lr_multiplier = float(o.lr_multiplier_by_family.get(m.family, 1.0))
    if not o.lr_multiplier > 0:
        _fail("optimizer.lr_multiplier", o.lr_multiplier, "must be > 0 (1: the train config's lr)")
    if o.name not in OPTIMIZERS:
        _fail(
            "optimizer.name",
            o.name,
            f"is not one of {', '.join(OPTIMIZERS)}; pick a file in conf/optimizer/",
        )
    if not 0.0 <= o.scape.sparsity < 1.0:
        _fail(
            "optimizer.scape.sparsity",
            o.scape.sparsity,
            "must be in [0, 1) (0.9 = 90% of entries not sent)",
        )
    if o.name == "scape":
        scape_config(o, t.train_steps)
    if o.name in PEERS:
        _validate_peer(cfg)
    if not 0 < o.min_lr <= o.lr:
        _fail("optimizer.min_lr", o.min_lr, f"must be in (0, optimizer.lr={o.lr}]")
    if t.precision not in PRECISIONS:
        _fail("train.precision", t.precision, f"is not one of {', '.join(PRECISIONS)}")
    if t.engine not in ENGINES:
        _fail("train.engine", t.engine, f"is not one of {', '.join(ENGINES)}")
    if t.engine == "simulator":
        _validate_simulator(cfg)
    if t.lr_decay_style not in ("cosine", "constant"):
        _fail("train.lr_decay_style", t.lr_decay_style, "is not one of cosine, constant")
    if c.launcher not in LAUNCHERS:
        _fail("cluster.launcher", c.launcher, f"is not one of {', '.join(LAUNCHERS)}")
    if c.backend not in BACKENDS:
        _fail("cluster.backend", c.backend, f"is not one of {', '.join(BACKENDS)}")
    if c.world_size < 1:
        _fail("cluster.ranks_per_node", c.ranks_per_node, "and cluster.nodes must be >= 1")
    per_step = t.micro_batch_size * c.world_size
    if t.global_batch_size % per_step:
        _fail(
            "train.global_batch_size",
            t.global_batch_size,
            f"is not divisible by micro_batch_size x world size = {t.micro_batch_size} x {c.world_size}; "
            f"use a multiple of {per_step}, e.g. {math.ceil(t.global_batch_size / per_step) * per_step}",
        )
    for key in (
        "train_steps",
        "eval_interval",
        "eval_iters",
        "log_interval",
        "checkpoint_interval",
        "keep_checkpoints",
    ):
        if getattr(t, key) < 1:
            _fail(f"train.{key}", getattr(t, key), "must be >= 1")
    if not 0 <= t.warmup_steps <= t.train_steps:
        _fail(
            "train.warmup_steps",
            t.warmup_steps,
            f"must be in [0, train.train_steps={t.train_steps}]",
        )
    if m.seq_length < 2:
        _fail("model.seq_length", m.seq_length, "must be >= 2")


def _validate_simulator(cfg: PretrainConfig) -> None:
    o, t, c = cfg.optimizer, cfg.train, cfg.cluster
    if o.name not in SIMULATED:
        _fail("optimizer.name", o.name, f"does not run on train.engine=simulator (it runs "
              f"{', '.join(SIMULATED)}); use train.engine=megatron")  # fmt: skip
    if t.precision != "fp32":
        _fail("train.precision", t.precision, "is not supported by train.engine=simulator "
              "(fp32 params); use train.precision=fp32 or train.engine=megatron")  # fmt: skip
    if c.launcher != "local":
        _fail("cluster.launcher", c.launcher, "cannot start train.engine=simulator (one "
              "process on this machine); use cluster=local")  # fmt: skip
    if o.name == "scape" and 128 % c.world_size:
        _fail("cluster.ranks_per_node", c.ranks_per_node, f"gives W={c.world_size}, which "
              "train.engine=simulator cannot lay out as Megatron would; use a W that divides "
              "128")  # fmt: skip


def _validate_peer(cfg: PretrainConfig) -> None:
    o = cfg.optimizer
    if cfg.train.precision != "fp32":
        _fail(
            "train.precision",
            cfg.train.precision,
            f"is not supported by optimizer.name={o.name} yet (the peers train fp32 models "
            "through torch DDP); use train.precision=fp32",
        )
    if o.name == "powersgd":
        if o.powersgd.rank < 1:
            _fail("optimizer.powersgd.rank", o.powersgd.rank, "must be >= 1")
        if o.powersgd.start_iter < 2:
            _fail(
                "optimizer.powersgd.start_iter",
                o.powersgd.start_iter,
                "must be >= 2 (torch's minimum)",
            )
        rule = ("optimizer.powersgd.local_rule", o.powersgd.local_rule)
    elif o.name == "dgc":
        if not 0.0 <= o.dgc.sparsity < 1.0:
            _fail("optimizer.dgc.sparsity", o.dgc.sparsity, "must be in [0, 1) (0.99 = 1% sent)")
        if not 0.0 <= o.dgc.momentum < 1.0:
            _fail("optimizer.dgc.momentum", o.dgc.momentum, "must be in [0, 1)")
        if o.dgc.value_dtype not in ("float32", "bfloat16"):
            _fail("optimizer.dgc.value_dtype", o.dgc.value_dtype, "is not one of float32, bfloat16")
        if o.dgc.local_clip < 0:
            _fail("optimizer.dgc.local_clip", o.dgc.local_clip, "must be >= 0 (0: off)")
        if not 0 <= o.dgc.warmup_steps <= cfg.train.train_steps:
            _fail(
                "optimizer.dgc.warmup_steps",
                o.dgc.warmup_steps,
                f"must be in [0, train.train_steps={cfg.train.train_steps}] (0: no warm-up)",
            )
        rule = ("optimizer.dgc.local_rule", o.dgc.local_rule)
    else:
        if not 1 <= o.onebit.freeze_step <= cfg.train.train_steps:
            _fail(
                "optimizer.onebit.freeze_step",
                o.onebit.freeze_step,
                f"must be in [1, train.train_steps={cfg.train.train_steps}]",
            )
        return
    if rule[1] not in LOCAL_RULES:
        _fail(rule[0], rule[1], f"is not one of {', '.join(LOCAL_RULES)}")


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose(overrides: list[str] | None = None, config_name: str = "pretrain") -> PretrainConfig:
    """Compose conf/<config_name>.yaml with command-line style overrides, typed and validated.

    What ``python -m pipelines.pretrain <overrides>`` would run, for tests and drivers.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf import OmegaConf

    register_configs()
    # Callable from inside a running Hydra app (a study driving pretrain runs): set its
    # global state aside and put it back afterwards.
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = hydra_compose(config_name=config_name, overrides=list(overrides or []))
    finally:
        restore_gh_from_backup(backup)
    cfg = OmegaConf.to_object(raw)
    validate(cfg)
    return cfg
