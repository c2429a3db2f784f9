"""The tables stage computes its ratios from the runs' own metrics and writes every format."""

import json

from omegaconf import OmegaConf

from pipelines.tables import TablesConfig, run
from pipelines.training.config import compose


def _fake_run(root, optimizer, step_time, bytes_per_step, final_val):
    cfg = compose([f"optimizer={optimizer}", "experiment=llama1p8b_step", "scale=tiny"])
    run_dir = root / cfg.experiment / f"{optimizer}"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    lines = []
    logged_val = final_val + 1.0 if optimizer == "adams" else final_val
    for step in range(1, 11):
        rec = {
            "step": step,
            "loss": 5.0 - 0.1 * step,
            "step_time": step_time,
            "bytes": {"grad_values": bytes_per_step / 2, "param_values": bytes_per_step / 2},
        }
        if step == 10:
            rec["val_loss"] = logged_val
        lines.append(json.dumps(rec))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "eval").mkdir()
    evaluation = {"tasks": {"cloze": {"acc": 0.25, "acc_stderr": 0.01, "examples": 200}}}
    if optimizer == "adams":  # the evaluate stage's full-split loss wins over training's estimate
        evaluation["validation"] = {"loss": final_val}
    (run_dir / "eval" / "results.json").write_text(json.dumps(evaluation))


def test_tables_from_the_runs_metrics(tmp_path):
    _fake_run(tmp_path / "runs", "adams", 2.0, 4e6, 4.00)
    _fake_run(tmp_path / "runs", "scape99", 0.5, 1e5, 4.04)
    out = run(TablesConfig(output_root=str(tmp_path / "runs"), out_dir=str(tmp_path / "tables")))
    assert out["runs"] == 2
    eff = (tmp_path / "tables" / "efficiency.md").read_text()
    # Loopback step times never become a speed-up (tests/pipelines/test_efficiency_table.py).
    assert "| llama1p8b_step | SCAPE-99 | 0.100 | 0.050 | 0.050 | 0.000 | up to 3.26x" in eff
    assert "No speed columns" in eff and "x |" not in eff
    quality = (tmp_path / "tables" / "quality.md").read_text()
    assert "| SCAPE-99 | 0.99 | 4.040 |" in quality and "+1.00%" in quality
    assert "cloze/acc" in quality and "stderr" not in quality and "examples" not in quality
    for name in [
        "quality.csv",
        "quality.tex",
        "efficiency.csv",
        "efficiency.tex",
        "loss_llama1p8b_step.png",
        "wandb_report.json",
    ]:
        assert (tmp_path / "tables" / name).stat().st_size > 0
    spec = json.loads((tmp_path / "tables" / "wandb_report.json").read_text())
    assert (
        spec["sections"][0]["group"] == "llama1p8b_step" and len(spec["sections"][0]["runs"]) == 2
    )
