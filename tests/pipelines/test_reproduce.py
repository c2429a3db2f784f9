"""`make reproduce-table SCALE=paper CLUSTER=vista DRY_RUN=1`: every sweep job written, none submitted."""

from pipelines.reproduce import PAPER_EXPERIMENTS, main


def test_paper_dry_run_writes_every_sbatch_script_and_config(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_ACCOUNT", "TG-ABC123")
    main(["--scale", "paper", "--cluster", "vista", "--dry-run", "--output-root", str(tmp_path)])
    scripts = sorted(tmp_path.glob("*/*/slurm/job.sbatch"))
    assert len(scripts) == 4 + 4 + 4 + 3  # the experiments' sweeps
    assert {p.parents[2].name for p in scripts} == set(PAPER_EXPERIMENTS)
    for script in scripts:
        text = script.read_text()
        assert "#SBATCH --nodes=32" in text and "#SBATCH --account=TG-ABC123" in text
        # compute nodes have no internet: the job reads the cache `make prefetch` filled
        assert "export HF_HOME=$WORK/scape-hf-cache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" in text
        assert (script.parents[1] / "config.yaml").is_file()
    out = capsys.readouterr().out
    assert "python -m pipelines.tables" in out and "dry_run" in out
    assert "wandb_report=true" in out and "make prefetch" in out
