"""Every shipped config composes into a valid PretrainConfig; bad values fail at start-up."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from pipelines.training.config import CONF_DIR, ConfigError, compose, scape_config
from scape.megatron.models import SHAPES, ModelShape

GROUP_FILES = {
    g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
    for g in ("model", "optimizer", "train", "cluster", "experiment", "scale")
}


@pytest.mark.parametrize("experiment", GROUP_FILES["experiment"])
@pytest.mark.parametrize("scale", ["tiny", "paper"])
def test_every_experiment_composes_at_both_scales(experiment, scale):
    cfg = compose([f"experiment={experiment}", f"scale={scale}"])
    assert cfg.experiment == experiment and cfg.scale == scale
    assert cfg.sweep, "an experiment names the optimizers it compares"
    for name in cfg.sweep:
        assert name in GROUP_FILES["optimizer"]
    if scale == "tiny":
        assert cfg.cluster.launcher == "local" and cfg.data.kind == "embedded"
        assert cfg.model.num_layers == 4 and cfg.model.name == f"tiny_{cfg.model.family}"
    else:
        assert cfg.cluster.name == "vista" and cfg.cluster.world_size == 32


def test_tiny_scale_keeps_the_family():
    assert compose(["experiment=llama1p8b_step", "scale=tiny"]).model.family == "llama"
    assert compose(["experiment=gpt345m_owt_quality", "scale=tiny"]).model.family == "gpt"


@pytest.mark.parametrize("optimizer", GROUP_FILES["optimizer"])
def test_every_optimizer_composes(optimizer):
    cfg = compose([f"optimizer={optimizer}"])
    if cfg.optimizer.name == "scape":
        sc = scape_config(cfg.optimizer)
        assert sc.density == pytest.approx(1 - cfg.optimizer.scape.sparsity)
        assert sc.sparsity == cfg.optimizer.scape.sparsity


@pytest.mark.parametrize("model", GROUP_FILES["model"])
def test_model_files_agree_with_the_builders_shapes(model):
    m = compose([f"model={model}"]).model
    if m.name.startswith("tiny"):
        return  # tiny CPU sizes are the pipeline's own; the builders' tiny shapes are for unit tests
    shape = SHAPES[m.name.replace("_", "-").replace("1p8b", "1.8b")]
    mine = ModelShape(
        shape.name,
        m.family,
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        m.ffn_hidden_size,
        m.vocab_size,
        m.seq_length,
        m.num_query_groups,
    )
    assert mine == shape


def test_vista_account_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLURM_ACCOUNT", "TG-XYZ123")
    assert compose(["cluster=vista", "train.global_batch_size=64"]).cluster.account == "TG-XYZ123"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("optimizer.scape.sparsity=1.0", "optimizer.scape.sparsity=1.0 must be in [0, 1)"),
        ("optimizer.scape.sparsity=-0.1", "optimizer.scape.sparsity=-0.1"),
        (
            "train.global_batch_size=10",
            "not divisible by micro_batch_size x world size = 2 x 2; use a multiple of 4, e.g. 12",
        ),
        ("cluster.ranks_per_node=3", "not divisible"),
        ("optimizer.scape.update=adam", "update='adam' is not one of"),
        ("optimizer.scape.sparsity=0.995", "sparsity=0.995 is not a whole number of coefficients"),
        ("optimizer.scape.chunk=300", "optimizer.scape.chunk=300 must be in [1, 256]"),
        ("train.precision=fp8", "train.precision='fp8' is not one of fp32, bf16"),
        ("model.hidden_size=130", "divisible by model.num_attention_heads"),
        ("optimizer.lr_multiplier=0", "optimizer.lr_multiplier=0.0 must be > 0"),
        (
            "+optimizer.lr_multiplier_by_family.mamba=2",
            "lr_multiplier_by_family.mamba=2.0 needs a family",
        ),
        (
            "++optimizer.lr_multiplier_by_family.llama=-1",
            "lr_multiplier_by_family.llama=-1.0 needs",
        ),
    ],
)
def test_invalid_values_are_rejected_with_the_key_and_fix(override, needle):
    with pytest.raises(ConfigError) as err:
        compose([override])
    assert needle in str(err.value)


def test_unknown_names_fail_at_composition():
    with pytest.raises(ConfigCompositionException, match="optimizer"):
        compose(["optimizer=sgd"])
    with pytest.raises((ValidationError, ConfigCompositionException)):
        compose(["train.not_a_key=1"])
    with pytest.raises((ValidationError, ConfigCompositionException)):
        compose(["train.train_steps=many"])


def test_conf_dir_is_the_repository_conf():
    assert Path(__file__).resolve().parents[3] / "conf" == CONF_DIR


def test_optimizer_scape_is_scape_config_with_sparsity_for_k():
    """optimizer.scape.* is ScapeConfig's fields and defaults, sparsity in place of k, so the
    library's defaults and the user's cannot drift apart; scape_config converts it."""
    import dataclasses

    from pipelines.training.config import ScapeSettings
    from scape.config import ScapeConfig

    settings = {f.name: f.default for f in dataclasses.fields(ScapeSettings)}
    config = {f.name: f.default for f in dataclasses.fields(ScapeConfig)}
    k = config.pop("k")
    assert settings.pop("sparsity") == 1 - k / config["chunk"]
    # the density ramp as a person writes it: a starting sparsity and a share of the run
    assert (config.pop("ramp_start_k"), config.pop("ramp_steps")) == (0, 0)
    assert (settings.pop("ramp_start_sparsity"), settings.pop("ramp_fraction")) == (None, 0.0)
    assert settings == config
    plain = {k: v for k, v in vars(ScapeSettings()).items() if not k.startswith("ramp_")}
    assert ScapeConfig.from_settings(plain) == ScapeConfig()  # (the ramp: scape_config's)
    cfg = compose(
        [
            "optimizer=scape90",
            "optimizer.scape.chunk=50",
            "optimizer.scape.update=sign",
            "optimizer.scape.value_dtype=float32",
        ]
    )  # the config's own choice: bf16
    assert scape_config(cfg.optimizer) == ScapeConfig(chunk=50, k=5, update="sign")


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["optimizer=dgc99", "optimizer.dgc.sparsity=1.0"], "optimizer.dgc.sparsity=1.0 must be in [0, 1)"),
        (["optimizer=dgc90", "optimizer.dgc.local_rule=sgd"], "optimizer.dgc.local_rule='sgd' is not one of adamw, adams"),
        (["optimizer=powersgd_r1", "optimizer.powersgd.rank=0"], "optimizer.powersgd.rank=0 must be >= 1"),
        (["optimizer=powersgd_r2", "optimizer.powersgd.start_iter=1"], "must be >= 2"),
        (["optimizer=onebit", "optimizer.onebit.freeze_step=500"], "must be in [1, train.train_steps=200]"),
        (["optimizer=onebit", "train.precision=bf16"], "use train.precision=fp32"),
    ],
)  # fmt: skip
def test_peer_options_are_checked_at_start_up(overrides, needle):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert needle in str(err.value)


def test_onebit_freezes_when_the_lr_warmup_ends():
    assert compose(["optimizer=onebit"]).optimizer.onebit.freeze_step == 20
    assert compose(["optimizer=onebit", "train.warmup_steps=7"]).optimizer.onebit.freeze_step == 7


@pytest.mark.parametrize("experiment", ["gpt345m_owt_quality", "llama500m_slimpj_quality"])
def test_tiny_table_setting_is_valid_for_the_reproduced_experiments(experiment):
    """`make reproduce-table`'s setting (conf/scale/tiny_table.yaml) composes for every optimizer
    of the sweep, alike for all of them, with a model that fits its tokenizer."""
    from data_prep.tokenizers import check_model_vocab
    from pipelines.reproduce import SCALE_CONFIGS

    base = compose([f"experiment={experiment}", "scale=tiny"])
    cfgs = [compose([f"experiment={experiment}", f"scale={SCALE_CONFIGS['tiny']}",
                     f"optimizer={name}"]) for name in base.sweep]  # fmt: skip
    first = cfgs[0]
    assert first.scale == "tiny" and first.cluster.launcher == "local"
    assert first.model.family == base.model.family
    # the corpus no run repeats (issue 52), as conf/data/debian_docs_large.yaml has it
    import yaml

    from pipelines.training.config import CONF_DIR

    group = yaml.safe_load((CONF_DIR / "data" / "debian_docs_large.yaml").read_text())
    assert {k: getattr(first.data, k) for k in group if k != "kind"} == {
        k: v for k, v in group.items() if k != "kind"
    }  # fmt: skip
    assert first.data.kind.value == group["kind"] == "files" and first.data.build == "large"
    assert first.tokenizer.kind == "bytebpe" and first.tokenizer.name == "bytebpe1k"
    check_model_vocab(first.tokenizer.name, first.tokenizer.vocab_size, first.model.vocab_size)
    assert first.train.train_steps > base.train.train_steps  # more steps than conf/scale/tiny
    for cfg in cfgs:  # only the optimizer differs between the runs of the table
        assert (cfg.model, cfg.train, cfg.data, cfg.tokenizer) == (
            first.model, first.train, first.data, first.tokenizer
        )  # fmt: skip
        assert (cfg.optimizer.lr, cfg.optimizer.min_lr) == (
            first.optimizer.lr,
            first.optimizer.min_lr,
        )


def test_lr_multiplier_scales_lr_and_min_lr_for_the_optimizer_and_schedule():
    cfg = compose(["optimizer=scape99", "optimizer.lr_multiplier=2", "optimizer.lr=1e-3",
                   "optimizer.min_lr=1e-4"])  # fmt: skip
    scaled = cfg.optimizer.scaled()
    assert scaled["lr"] == 2e-3 and scaled["min_lr"] == 2e-4
    assert {k: v for k, v in scaled.items() if k not in ("lr", "min_lr")} == {
        k: v for k, v in cfg.optimizer.shared().items() if k not in ("lr", "min_lr")
    }


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["train.engine=jax"], "train.engine='jax' is not one of megatron, simulator"),
        (["train.engine=simulator", "optimizer=dgc99"],
         "optimizer.name='dgc' does not run on train.engine=simulator"),
        (["train.engine=simulator", "train.precision=bf16"],
         "train.precision='bf16' is not supported by train.engine=simulator"),
        (["train.engine=simulator", "cluster=vista"], "cluster.launcher='slurm' cannot start"),
        (["train.engine=simulator", "cluster.ranks_per_node=3", "train.global_batch_size=12",
          "train.micro_batch_size=1"], "gives W=3, which train.engine=simulator cannot lay out"),
    ],
)  # fmt: skip
def test_the_simulator_engine_says_what_it_cannot_run(overrides, needle):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert needle in str(err.value)


def test_a_density_ramp_is_a_share_of_the_run_and_errors_name_the_fix():
    # the shipped SCAPE-99 ramps from 90% over 15% of the run (the quality study's winner)
    cfg = compose(["optimizer=scape99", "train.train_steps=300"])
    built = scape_config(cfg.optimizer, cfg.train.train_steps)
    assert (built.k, built.ramp_start_k, built.ramp_steps) == (1, 10, 45)
    assert scape_config(cfg.optimizer).ramp_steps == 0  # the steady state: no ramp
    assert scape_config(cfg.optimizer, 3).ramp_steps == 1  # at least one step
    off = compose(["optimizer=scape99", "optimizer.scape.ramp_start_sparsity=null",
                   "optimizer.scape.ramp_fraction=0"])  # fmt: skip
    assert scape_config(off.optimizer, 300).ramp_steps == 0
    assert scape_config(compose(["optimizer=scape90"]).optimizer, 300).ramp_steps == 0
    # at start-up, in one line each
    with pytest.raises(ConfigError, match=r"ramp_fraction=0.0: a density ramp needs both.*"
                                          r"no ramp: ramp_start_sparsity=null"):  # fmt: skip
        compose(["optimizer=scape99", "optimizer.scape.ramp_fraction=0"])
    with pytest.raises(ConfigError, match=r"ramp_start_k=.* must be in \(k=10, chunk=100\]"):
        compose(["optimizer=scape90", "optimizer.scape.ramp_start_sparsity=0.95",
                 "optimizer.scape.ramp_fraction=0.1"])  # fmt: skip
