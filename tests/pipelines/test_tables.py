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
    assert "| llama1p8b_step | SCAPE-99 | 0.100 | 0.050 | 0.050 | 0.000 | 0.100 |\n" in eff
    assert "No speed columns" in eff and "x |" not in eff
    # The paper's claims: a line of their own under each table, never a column of our rows.
    for name in ("efficiency.md", "quality.md"):
        text = (tmp_path / "tables" / name).read_text()
        claims = [line for line in text.splitlines() if line.startswith("The paper's claims")]
        assert claims == [
            "The paper's claims (its abstract; no table values are public), not ours: "
            "llama1p8b_step: up to 3.26x faster steps than dense AdamS."
        ]
        assert "paper" not in text.splitlines()[2]  # the header row
        assert (
            "(runs of commit unrecorded)" in text.splitlines()[0]
            or "runs of commit unrecorded" in text
        )
    quality = (tmp_path / "tables" / "quality.md").read_text()
    assert "| SCAPE-99 | 0.99 | 4.040 |" in quality and "+1.00%" in quality
    assert "cloze/acc" in quality and "stderr" not in quality and "examples" not in quality
    for name in [
        "quality.csv",
        "quality.tex",
        "efficiency.csv",
        "efficiency.tex",
        "loss_llama1p8b_step.png",
    ]:
        assert (tmp_path / "tables" / name).stat().st_size > 0
    assert not list((tmp_path / "tables").glob("wandb_report*"))  # only with wandb_report=true


def test_manifest_traces_every_row_to_its_run_config_metrics_and_commit(tmp_path):
    from pipelines.training.provenance import git_version, record_provenance

    root = tmp_path / "runs"
    _fake_run(root, "adams", 2.0, 4e6, 4.00)
    _fake_run(root, "scape99", 0.5, 1e5, 4.04)
    record_provenance(root / "llama1p8b_step" / "scape99")  # as the pretrain stage does
    run(TablesConfig(output_root=str(root), out_dir=str(tmp_path / "tables")))
    manifest = json.loads((tmp_path / "tables" / "manifest.json").read_text())
    here = git_version()
    assert manifest["tables_commit"] == here
    by_run = {r["run"]: r for r in manifest["runs"]}
    assert by_run["scape99"]["provenance"]["commit"] == here["commit"]
    assert by_run["adams"]["provenance"] == {}  # none recorded: said so, not invented
    assert by_run["adams"]["final"]["val_loss"] == 4.00 and by_run["adams"]["final"]["steps"] == 10
    assert by_run["scape99"]["final"]["tasks"] == {"cloze/acc": 0.25}
    assert by_run["scape99"]["config"]["optimizer"]["label"] == "SCAPE-99"
    for path in by_run["scape99"]["logs"].values():
        assert (root / path).is_file(), path
    quality = (tmp_path / "tables" / "quality.md").read_text().splitlines()[0]
    assert f"runs of commits {here['commit'][:10]}, unrecorded" in quality


def _evaluated_run(root, data_root, optimizer, val_loss, tasks, chance=None):
    """A finished, evaluated run whose prepared data (a 24-article slice) is at data_root."""
    cfg = compose([f"optimizer={optimizer}", "experiment=gpt345m_owt_quality", "scale=tiny",
                   f"data_root={data_root}", "data.max_documents=24",
                   "data.split_ratios=[0.6,0.2,0.2]", "tokenizer.name=bpe500",
                   "tokenizer.vocab_size=500"])  # fmt: skip
    run_dir = root / cfg.experiment / optimizer
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 7.0, "step_time": 1.0}))
    (run_dir / "eval").mkdir()
    evaluation = {"validation": {"loss": val_loss}, "tasks": tasks}
    if chance:  # the evaluate stage records the local tasks' measured chance rates
        evaluation["local_tasks"] = {"tasks": {t: {"chance": c} for t, c in chance.items()}}
    (run_dir / "eval" / "results.json").write_text(json.dumps(evaluation))
    return cfg


def test_unigram_level_and_chance_marks_in_the_quality_table(tmp_path):
    from data_prep.config import PrepareConfig
    from data_prep.dataset import load_prepared
    from data_prep.prepare import prepare
    from eval.unigram import unigram_level

    n = 200  # items per task: a guesser's standard error on a 4-way task is 0.031
    cfg = _evaluated_run(tmp_path / "runs", tmp_path / "data", "adams", 4.0, {
        "scape_nextsent": {"acc": 0.27, "acc_norm": 0.40, "examples": n},  # at chance; not
        "scape_lastword": {"acc": 0.0, "examples": n},
        "cloze": {"acc": 0.27, "examples": n},  # no known chance rate: never marked
    }, chance={"scape_lastword": 0.015})  # fmt: skip
    _evaluated_run(tmp_path / "runs", tmp_path / "data", "scape99", 4.5, {
        "scape_nextsent": {"acc": 0.20, "acc_norm": 0.31, "examples": n},  # below / +1.96 SE
        # the most frequent last word is right 1.5% of the time: one right answer in 200 is
        # within noise of that guesser (SE 0.0086), not a result
        "scape_lastword": {"acc": 0.005, "examples": n},
        "cloze": {"acc": 0.5, "examples": n},
    }, chance={"scape_lastword": 0.015})  # fmt: skip
    _evaluated_run(tmp_path / "runs", tmp_path / "data", "scape90", 4.4, {
        "scape_lastword": {"acc": 0.06, "examples": n},  # +5 SE: above chance
        "scape_nextsent": {"acc": 0.32, "acc_norm": 0.22, "examples": n},  # +2.3 SE; below
    }, chance={"scape_lastword": 0.015})  # fmt: skip
    result = prepare(PrepareConfig(data=cfg.data, tokenizer=cfg.tokenizer,
                                   output_root=str(tmp_path / "data"), num_proc=1, progress=False))  # fmt: skip
    level = unigram_level(load_prepared(result.path)).loss

    run(TablesConfig(output_root=str(tmp_path / "runs"), out_dir=str(tmp_path / "tables")))
    quality = (tmp_path / "tables" / "quality.md").read_text()
    rows = {line.split(" | ")[2]: line for line in quality.splitlines() if line.startswith("| gpt")}
    assert (
        f"| {4.0 - level:+.3f} |" in rows["AdamS"] and f"| {4.5 - level:+.3f} |" in rows["SCAPE-99"]
    )
    # columns: cloze/acc, scape_lastword/acc, scape_nextsent/acc, scape_nextsent/acc_norm
    assert "| 0.270 | at chance (0.000) | at chance (0.270) | 0.400 |" in rows["AdamS"]
    assert (
        "| 0.500 | at chance (0.005) | at chance (0.200) | at chance (0.310) |" in rows["SCAPE-99"]
    )
    assert "| - | 0.060 | 0.320 | at chance (0.220) |" in rows["SCAPE-90"]
    notes = quality.split("Notes:")[1]
    assert f"Unigram level of {result.path.name}: {level:.3f} nats per token" in notes
    assert f"AdamS ends {level - 4.0:.3f} nats under the unigram level" in notes
    assert "scape_lastword 0.015, scape_nextsent 0.250" in notes and "cloze" not in notes
    tex = (tmp_path / "tables" / "quality.tex").read_text()
    assert "at chance (0.270)" in tex and "Unigram level of" in tex
