"""The quality study's config: its variants, scale presets and run fingerprints, and why
the no-delay ablation is run only for statistics that read the residual."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines.quality_study import plan_runs
from pipelines.studies.quality_config import RunSpec, VariantSpec
from pipelines.studies.readings import ReadingConfig
from scape.config import ScapeConfig


def test_config_composes_and_every_variant_is_valid(compose_study) -> None:
    cfg = compose_study()
    assert cfg.scale.name == "small" and {m.name for m in cfg.scale.models} == {"llama", "gpt"}
    core = [k for k, v in cfg.variants.items() if v.core]
    assert core[:2] == ["adams", "adamw"] and {"r0_99", "r0ef_99", "r6rms_99"} <= set(core)
    for name, variant in cfg.variants.items():
        if "ramp_fraction" in variant.options:  # configs exist per run length
            variant = RunSpec(cfg.scale.models[0], name, variant, 0, cfg.scale, "d").variant
        built = variant.scape_config()
        assert (built is None) == (variant.method != "scape"), name
        if variant.method == "reading":
            ReadingConfig(**variant.run_options())  # a study-only reading: its options validate
    assert set(cfg.finalists) <= set(cfg.variants)
    # R0-99 EF is the paper's design as the reference doc infers it (the issue-7 library
    # step); R0-99 differs from it only in error feedback. Explicit, so that a change of the
    # readings' defaults cannot silently change what these rows mean.
    r0 = ReadingConfig(**cfg.variants["r0_99"].run_options())
    assert (r0.reading, r0.basis, r0.chunk, r0.k, r0.density) == ("owner", "identity", 0, 0, 0.01)
    assert (r0.statistic, r0.delay_mask, r0.off_mask, r0.age_step) == (
        "momentum",
        True,
        "freeze",
        "none",
    )
    assert not r0.error_feedback
    assert ReadingConfig(**cfg.variants["r0ef_99"].run_options()) == replace(
        r0, error_feedback=True
    )


def test_variant_options_are_checked_at_start_up() -> None:
    with pytest.raises(ValueError, match="method='sgd'"):
        VariantSpec(method="sgd")
    with pytest.raises(ValueError, match="takes no options"):
        VariantSpec(method="adams", options={"sparsity": 0.99})
    for key in ("k", "density"):  # the code's counts; a person writes sparsity
        with pytest.raises(ValueError, match=f"options.{key}=.*write options.sparsity"):
            VariantSpec(method="reading", options={key: 1})
    assert VariantSpec(method="scape", options={"sparsity": 0.9}).exchanged_density() == 0.1


def test_sparsity_becomes_the_codes_count_per_chunk() -> None:
    """run_options turns the sparsity a variant says into what the code counts: k per chunk
    (the scape default's chunk of 100, or a reading's own), or for a whole-shard reading
    (chunk 0) k 0 and the exact density (1 - 0.9 in binary floating point is not 0.1)."""
    scape90 = VariantSpec(method="scape", options={"sparsity": 0.9, "update": "sign"})
    assert scape90.run_options() == {"k": 10, "update": "sign"}
    assert scape90.scape_config() == ScapeConfig(k=10, update="sign")
    c200 = VariantSpec(method="scape", options={"chunk": 200, "sparsity": 0.99})
    assert c200.run_options() == {"chunk": 200, "k": 2}
    probe = VariantSpec(method="reading", options={"chunk": 64, "sparsity": 0.984375})
    assert probe.run_options() == {"chunk": 64, "k": 1}
    dense_limit = VariantSpec(method="reading", options={"chunk": 100, "sparsity": 0.0})
    assert dense_limit.run_options()["k"] == 100 and dense_limit.exchanged_density() == 1.0
    r0 = VariantSpec(method="reading", options={"chunk": 0, "sparsity": 0.9})
    assert r0.run_options() == {"chunk": 0, "k": 0, "density": 0.1}
    with pytest.raises(ValueError, match="sparsity=0.995 is not a whole number"):
        VariantSpec(method="scape", options={"sparsity": 0.995}).run_options()


def test_stored_runs_keep_their_fingerprints() -> None:
    """A run's fingerprint hashes the options as the code takes them (and the clip under its
    old name), so the runs stored while variants said ``k: 1`` / ``density: 0.1`` and the
    scale said ``max_grad_norm`` are found again (and skipped) now that they say ``sparsity``
    and ``clip_grad``. The fingerprints are those in the headers of
    results/quality/runs/gpt__r0_90__s0__t300__lr2.jsonl and gpt__scape99__s0__t300__lr0.5.jsonl."""
    from pipelines.studies.quality_config import ModelSpec, ScaleConfig

    gpt = ModelSpec(name="gpt", family="gpt")
    small = ScaleConfig(
        name="small", models=[gpt], steps=300, eval_interval=25, val_max_sequences=128,
        lr=3e-3, min_lr=3e-4,
    )  # fmt: skip
    data = "data/enwiki_sample__bytebpe1k"
    r0_90 = VariantSpec(method="reading", options={"reading": "owner", "basis": "identity",
                                                   "chunk": 0, "sparsity": 0.9})  # fmt: skip
    scape99 = VariantSpec(method="scape", options={"sparsity": 0.99})
    assert RunSpec(gpt, "r0_90", r0_90, 0, small, data, 2.0).fingerprint() == "a1701e0efc224fb5"
    assert RunSpec(gpt, "scape99", scape99, 0, small, data, 0.5).fingerprint() == "5c2b6354941623a1"
    # a variant's own clip norm is a setting of its runs: clip 0 is another run, and naming
    # the scale's own norm is the same run as not naming one
    noclip = VariantSpec(method="scape", options={"sparsity": 0.99}, clip_grad=0.0)
    unclipped = RunSpec(gpt, "scape99_noclip", noclip, 0, small, data, 0.5)
    assert unclipped.scale.clip_grad == 0.0 and small.clip_grad == 1.0
    assert unclipped.fingerprint() != "5c2b6354941623a1"
    same = VariantSpec(method="scape", options={"sparsity": 0.99}, clip_grad=small.clip_grad)
    assert RunSpec(gpt, "scape99", same, 0, small, data, 0.5).fingerprint() == "5c2b6354941623a1"
    with pytest.raises(ValueError, match=r"clip_grad=-1.0: use 0 \(no clipping\)"):
        VariantSpec(method="adams", clip_grad=-1.0)


def test_issue_scale_is_the_issues_10_to_30m_params_and_presets_compose(compose_study) -> None:
    from scape.megatron.models import ModelShape, count_params

    cfg = compose_study("quality/scale@scale=issue")
    for m in cfg.scale.models:
        shape = ModelShape(
            m.name, m.family, m.num_layers, m.hidden_size, m.num_attention_heads,
            m.ffn_hidden_size, 1024, cfg.scale.seq_length, num_query_groups=m.num_query_groups,
        )  # fmt: skip
        assert 10e6 <= count_params(shape) <= 30e6, m.name
    assert 4 <= cfg.scale.world_size <= 8
    assert compose_study("quality/scale@scale=long").scale.steps > compose_study().scale.steps


def test_fingerprint_tracks_settings_not_labels(compose_study) -> None:
    cfg = compose_study()
    spec = plan_runs(cfg)[0]
    relabelled = RunSpec(
        spec.model, spec.variant_name, VariantSpec(**{**vars(spec.variant), "label": "x"}),
        spec.seed, spec.scale, spec.data_dir,
    )  # fmt: skip
    assert relabelled.fingerprint() == spec.fingerprint()
    other = RunSpec(spec.model, spec.variant_name, spec.variant, 7, spec.scale, spec.data_dir)
    assert other.fingerprint() != spec.fingerprint()
    # The lr grid: a scaled run has its own id and fingerprint; scale 1 keeps the plain ones.
    half = RunSpec(*[getattr(spec, f) for f in ("model", "variant_name", "variant", "seed",
                                                "scale", "data_dir")], lr_scale=0.5)  # fmt: skip
    assert half.run_id == spec.run_id + "__lr0.5" and half.fingerprint() != spec.fingerprint()
    assert spec.run_id.endswith(f"__t{spec.scale.steps}")


def test_a_ramp_written_as_a_share_of_the_run_becomes_its_steps():
    """ramp_fraction (the study's) is the library's ramp_steps at each run's length, so runs
    of two lengths carry, and are fingerprinted by, their own steps."""
    from pipelines.studies.quality_config import ModelSpec, RunSpec, ScaleConfig, VariantSpec

    ramp = VariantSpec(method="scape", options={"sparsity": 0.99, "ramp_start_sparsity": 0.9,
                                                "ramp_fraction": 0.15})  # fmt: skip
    model = ModelSpec(name="m", family="gpt")
    specs = [RunSpec(model, "r", ramp, 0, ScaleConfig(name="s", steps=n), "data/x")
             for n in (300, 1500)]  # fmt: skip
    assert [s.variant.scape_config().ramp_steps for s in specs] == [45, 225]
    assert specs[0].variant.scape_config().ramp_start_k == 10
    assert specs[0].fingerprint() != specs[1].fingerprint()
    fixed = VariantSpec(method="scape", options={"sparsity": 0.99, "ramp_start_sparsity": 0.9,
                                                 "ramp_steps": 225})  # fmt: skip
    same = RunSpec(model, "r", fixed, 0, ScaleConfig(name="s", steps=1500), "data/x")
    assert same.fingerprint() == specs[1].fingerprint()  # the settings, not how they were written
    assert ramp.exchanged_density() == 0.01  # after the ramp
