"""A run directory holds one run: other settings are refused, bookkeeping and other
optimizers' options are not settings."""

import pytest

from pipelines.training.config import ConfigError, compose
from pipelines.training.runs import claim_run_dir, holds_other_run, run_dir_of, set_aside


def test_a_run_directory_is_not_reused_for_other_settings(tmp_path):
    cfg = compose(["optimizer=scape99", f"output_root={tmp_path}"])
    claim_run_dir(cfg, run_dir_of(cfg))
    claim_run_dir(
        compose(["optimizer=scape99", f"output_root={tmp_path}", "progress=false"]), run_dir_of(cfg)
    )
    changed = compose(
        ["optimizer=scape99", f"output_root={tmp_path}", "optimizer.scape.moment_beta=0.9"]
    )
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        claim_run_dir(changed, run_dir_of(changed))


def test_options_of_other_optimizers_do_not_orphan_a_run(tmp_path):
    """A dense run's directory stays valid when SCAPE's defaults change or options are added."""
    from omegaconf import OmegaConf

    cfg = compose(["optimizer=adams", f"output_root={tmp_path}"])
    run_dir = run_dir_of(cfg)
    claim_run_dir(cfg, run_dir)
    saved = OmegaConf.load(run_dir / "config.yaml")
    saved.optimizer.scape.moment_beta = 0.5
    del saved.optimizer["dgc"]  # as written before the peers existed
    saved.train.consistency_check_interval = 7  # bookkeeping: the numbers do not change
    OmegaConf.save(saved, run_dir / "config.yaml")
    claim_run_dir(cfg, run_dir)
    saved.optimizer.lr_multiplier_by_family = {"llama": 8.0}  # a recipe for another family
    OmegaConf.save(saved, run_dir / "config.yaml")
    claim_run_dir(cfg, run_dir)
    saved.optimizer.lr_multiplier = 2.0  # the multiplier applied to this run: a setting
    OmegaConf.save(saved, run_dir / "config.yaml")
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        claim_run_dir(cfg, run_dir)
    saved.optimizer.lr_multiplier = 1.0
    saved.optimizer.lr = 1.0
    OmegaConf.save(saved, run_dir / "config.yaml")
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        claim_run_dir(cfg, run_dir)


def test_a_run_of_changed_settings_is_set_aside_not_deleted(tmp_path):
    """What make reproduce-table does after a config changed: the old run moves beside the
    new one's directory, every file kept, and the new run claims a fresh directory."""
    cfg = compose(["optimizer=scape99", f"output_root={tmp_path}"])
    run_dir = run_dir_of(cfg)
    assert not holds_other_run(cfg, run_dir)  # nothing there yet
    claim_run_dir(cfg, run_dir)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    assert not holds_other_run(cfg, run_dir)
    other_lr = f"optimizer.lr_multiplier={2 * cfg.optimizer.lr_multiplier:g}"  # not the recipe's
    changed = compose(["optimizer=scape99", f"output_root={tmp_path}", other_lr])
    assert holds_other_run(changed, run_dir)
    moved = set_aside(run_dir)
    assert moved.parent == run_dir.parent / ".superseded"
    assert moved.name.startswith(f"{run_dir.name}-")
    assert list(tmp_path.glob("*/*/config.yaml")) == []  # the tables stage no longer sees it
    assert (moved / "metrics.jsonl").read_text() == "{}\n" and not run_dir.exists()
    claim_run_dir(changed, run_dir)  # the new run starts clean
