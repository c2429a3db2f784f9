"""The Slurm path writes exactly what it would submit (dry run), and names missing settings."""

import pytest

from pipelines.pretrain import run
from pipelines.training.config import ConfigError, compose


def test_dry_run_writes_sbatch_and_resolved_config(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ACCOUNT", "TG-ABC123")
    cfg = compose(
        [
            "experiment=llama500m_slimpj_quality",
            "scale=paper",
            "optimizer=scape90",
            "dry_run=true",
            f"output_root={tmp_path}",
        ]
    )
    out = run(cfg)
    assert out["status"] == "dry_run"
    script = (
        tmp_path
        / "llama500m_slimpj_quality"
        / "llama_500m-SCAPE-90-seed1234"
        / "slurm"
        / "job.sbatch"
    ).read_text()
    for line in [
        "#SBATCH --account=TG-ABC123",
        "#SBATCH --partition=gh",
        "#SBATCH --nodes=32",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --time=720",
        "module load gcc cuda",
    ]:
        assert line in script
    resolved = (
        tmp_path / "llama500m_slimpj_quality" / "llama_500m-SCAPE-90-seed1234" / "config.yaml"
    ).read_text()
    assert (
        "sparsity: 0.9" in resolved
        and "name: llama_500m" in resolved
        and "backend: nccl" in resolved
    )


def test_missing_account_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    cfg = compose(["experiment=gpt345m_owt_quality", "dry_run=true", f"output_root={tmp_path}"])
    with pytest.raises(ConfigError, match="export SLURM_ACCOUNT=<your allocation>"):
        run(cfg)


def test_a_job_array_refuses_runs_with_different_resources(tmp_path, monkeypatch):
    from pipelines.training.runs import run_dir_of
    from pipelines.training.slurm import submit_sweep

    monkeypatch.setenv("SLURM_ACCOUNT", "TG-ABC123")
    a = compose(["experiment=llama1p8b_step", "optimizer=adams", f"output_root={tmp_path}"])
    b = compose(
        [
            "experiment=llama1p8b_step",
            "optimizer=scape99",
            "cluster.nodes=16",
            "train.global_batch_size=64",
            f"output_root={tmp_path}",
        ]
    )
    with pytest.raises(ConfigError, match="identical resources"):
        submit_sweep([a, b], [run_dir_of(a), run_dir_of(b)])


def test_a_run_directory_is_not_reused_for_other_settings(tmp_path):
    from pipelines.training.runs import claim_run_dir, run_dir_of

    cfg = compose(["optimizer=scape99", f"output_root={tmp_path}"])
    claim_run_dir(cfg, run_dir_of(cfg))
    claim_run_dir(
        compose(["optimizer=scape99", f"output_root={tmp_path}", "progress=false"]), run_dir_of(cfg)
    )
    changed = compose(
        ["optimizer=scape99", f"output_root={tmp_path}", "optimizer.scape.error_feedback=true"]
    )
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        claim_run_dir(changed, run_dir_of(changed))


def test_options_of_other_optimizers_do_not_orphan_a_run(tmp_path):
    """A dense run's directory stays valid when SCAPE's defaults change or options are added."""
    from omegaconf import OmegaConf

    from pipelines.training.runs import claim_run_dir, run_dir_of

    cfg = compose(["optimizer=adams", f"output_root={tmp_path}"])
    run_dir = run_dir_of(cfg)
    claim_run_dir(cfg, run_dir)
    saved = OmegaConf.load(run_dir / "config.yaml")
    saved.optimizer.scape.error_feedback = not saved.optimizer.scape.error_feedback
    del saved.optimizer["dgc"]  # as written before the peers existed
    saved.train.consistency_check_interval = 7  # bookkeeping: the numbers do not change
    OmegaConf.save(saved, run_dir / "config.yaml")
    claim_run_dir(cfg, run_dir)
    saved.optimizer.lr = 1.0
    OmegaConf.save(saved, run_dir / "config.yaml")
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        claim_run_dir(cfg, run_dir)
