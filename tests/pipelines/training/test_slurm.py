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
