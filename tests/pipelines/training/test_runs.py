"""A run directory holds one run: other settings are refused, bookkeeping and other
optimizers' options are not settings."""

import pytest

from pipelines.training.config import ConfigError, compose
from pipelines.training.runs import claim_run_dir, run_dir_of


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
    saved.optimizer.lr = 1.0
    OmegaConf.save(saved, run_dir / "config.yaml")
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        claim_run_dir(cfg, run_dir)
