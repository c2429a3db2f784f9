"""The peers study stage: its planner under the verdict's protocol (lr per method over the
seeds, grids closed on every seed, one code version per directory) with fake finished runs,
and a quick real run through pretrain (its report: tests/pipelines/studies/test_peers_report.py)."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipelines.peers_study import (
    STUDY_METHODS,
    STUDY_OVERRIDES,
    STUDY_SOURCES,
    PeersStudyConfig,
    grid_extensions,
    pack_runs,
    plan_runs,
    run,
    study_code,
    unpack_runs,
)

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, **kw):
    return PeersStudyConfig(methods=["adams", "dgc99"], seeds=[1, 2], output_root=str(tmp_path),
                            progress=False, **kw)  # fmt: skip


def _finish(run, loss):
    run.run_dir.mkdir(parents=True, exist_ok=True)
    summary = {"status": "finished", "step": run.cfg.train.train_steps, "final_val_loss": loss}
    (run.run_dir / "summary.json").write_text(json.dumps(summary))


def test_the_plan_is_every_method_lr_and_seed_in_its_code_versions_directory(tmp_path):
    runs = plan_runs(_cfg(tmp_path), "v1")
    assert len(runs) == 2 * 2 * 3
    assert [(r.method, r.lr_scale, r.seed) for r in runs[:3]] == [
        ("adams", 1.0, 1), ("adams", 2.0, 1), ("adams", 4.0, 1)
    ]  # fmt: skip
    dgc = next(r for r in runs if r.method == "dgc99" and r.lr_scale == 4.0 and r.seed == 2)
    assert dgc.run_dir == tmp_path / "v1" / "peers_gpt345m_owt" / "tiny_gpt-DGC-99-lr4-seed2"
    assert dgc.cfg.optimizer.scaled()["lr"] == pytest.approx(4 * dgc.cfg.optimizer.lr)
    assert dgc.cfg.train.seed == 2 and dgc.cfg.train.train_steps == 400
    assert dgc.cfg.model.vocab_size == dgc.cfg.tokenizer.vocab_size == 1024
    assert dgc.cfg.optimizer.dgc.warmup_steps == dgc.cfg.train.warmup_steps > 0  # DGC's warm-up on
    assert len({r.run_dir for r in runs}) == len(runs)


def test_the_runs_records_pack_and_unpack_without_checkpoints(tmp_path):
    runs = plan_runs(_cfg(tmp_path / "out"), "v1")[:2]
    for i, r in enumerate(runs):
        _finish(r, 5.0 + i)
        (r.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 6.0}\n')
        (r.run_dir / "checkpoints").mkdir()
        (r.run_dir / "checkpoints" / "big.pt").write_bytes(b"x" * 1000)
    archive = pack_runs(runs, tmp_path / "out", tmp_path / "results" / "runs.tar.xz")
    fresh = tmp_path / "fresh"
    assert unpack_runs(archive, fresh) == 4  # summary and metrics of each, nothing else
    for r in runs:
        moved = fresh / r.run_dir.relative_to(tmp_path / "out")
        assert (moved / "summary.json").read_text() == (r.run_dir / "summary.json").read_text()
        assert not (moved / "checkpoints").exists()
    assert unpack_runs(archive, fresh) == 0  # what is there is kept


def test_grids_close_on_every_seed_until_the_best_lr_is_inside(tmp_path):
    cfg = _cfg(tmp_path)
    runs = plan_runs(cfg, "v1")
    # AdamS is best at x4, the grid's top, on the mean over seeds (seed 2 alone prefers x2);
    # DGC-99 at x2, inside the grid.
    losses = {("adams", 1.0): (5.0, 5.0), ("adams", 2.0): (4.5, 4.0), ("adams", 4.0): (4.0, 4.2),
              ("dgc99", 1.0): (6.0, 6.0), ("dgc99", 2.0): (5.0, 5.1), ("dgc99", 4.0): (5.5, 5.5)}  # fmt: skip
    for r in runs:
        _finish(r, losses[(r.method, r.lr_scale)][r.seed - 1])
    more = grid_extensions(cfg, runs, "v1")
    assert [(r.method, r.lr_scale, r.seed) for r in more] == [("adams", 8.0, 1), ("adams", 8.0, 2)]
    assert more[0].run_dir.name == "tiny_gpt-AdamS-lr8-seed1"
    # Not yet finished: nothing more is planned (the same runs are not planned twice either).
    assert grid_extensions(cfg, runs + more, "v1") == []
    for r, loss in zip(more, (4.3, 4.6), strict=True):  # x8 worse: x4 is now inside the grid
        _finish(r, loss)
    assert grid_extensions(cfg, runs + more, "v1") == []
    # A seed that diverged at the best point moves the choice: x4 on seed 2 now NaN.
    _finish(next(r for r in runs if (r.method, r.lr_scale, r.seed) == ("adams", 4.0, 2)), None)
    assert grid_extensions(cfg, runs + more, "v1") == []  # x2 wins, inside the grid


def test_a_method_missing_a_seed_waits(tmp_path):
    cfg = _cfg(tmp_path)
    runs = plan_runs(cfg, "v1")
    for r in runs:
        if not (r.method == "dgc99" and r.seed == 2):
            _finish(r, 5.0 - r.lr_scale / 10)  # every finished cell prefers the top, x4
    more = grid_extensions(cfg, runs, "v1")
    # DGC-99's choice over seed 1 alone would be x4: it waits for seed 2 instead.
    assert {(r.method, r.lr_scale, r.seed) for r in more} == {("adams", 8.0, 1), ("adams", 8.0, 2)}


def test_code_version_follows_the_sources_only(tmp_path):
    source = tmp_path / STUDY_SOURCES[0]
    source.parent.mkdir(parents=True)
    source.write_text("x = 1\n")
    before = study_code(tmp_path)
    (tmp_path / "scape" / "simulate.py").write_text("not a study source\n")
    assert study_code(tmp_path) == before
    source.write_text("x = 2\n")
    assert study_code(tmp_path) != before
    # the loop and the record/evaluation every run goes through compute its numbers too
    assert {"scape/peers/dgc.py", "pipelines/training/peer_engine.py",
            "pipelines/training/loop.py", "pipelines/training/metrics.py"} <= set(STUDY_SOURCES)  # fmt: skip
    assert all((REPO / s).is_file() for s in STUDY_SOURCES)  # a rename must update the list


def test_the_yaml_and_the_schema_agree_on_the_setting():
    yaml = OmegaConf.load(REPO / "conf" / "peers_study.yaml")
    default = PeersStudyConfig()
    assert list(yaml.overrides) == STUDY_OVERRIDES == default.overrides
    assert list(yaml.lr_scales) == default.lr_scales and yaml.close_grids == default.close_grids
    assert list(yaml.methods) == STUDY_METHODS == default.methods
    sweep = list(OmegaConf.load(REPO / "conf" / "experiment" / "peers_gpt345m_owt.yaml").sweep)
    assert [m for m in STUDY_METHODS if m != "adamw"] == sweep  # every peer, and AdamW


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_quick_study_runs_both_methods_through_pretrain(tmp_path, prepared_default, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = PeersStudyConfig(
        quick=True,
        output_root=str(tmp_path / "runs"),
        out_dir=str(tmp_path / "out"),
        progress=False,
    )
    doc = run(cfg)
    methods = {m["method"]: m for m in doc["methods"]}
    assert list(methods) == ["adams", "dgc99"]
    code = study_code(REPO)
    assert doc["code"]["version"] == code
    assert methods["dgc99"]["runs"] == ["tiny_gpt-DGC-99-lr1-seed1234"]
    assert (
        tmp_path / "runs" / code / "peers_gpt345m_owt" / "tiny_gpt-DGC-99-lr1-seed1234"
    ).is_dir()
    assert methods["adams"]["lr_scale"] == 1.0 and not methods["adams"]["closed"]  # one point
    # The byte formula at the run's own shape is what the run's last step counted.
    for m in methods.values():
        assert m["bytes"]["formula_here"] == pytest.approx(m["bytes"]["measured_last"], rel=1e-3)
    # DGC's warm-up (2 steps of the 6 at 25%) sends more than its steady state on average.
    assert (
        methods["dgc99"]["bytes"]["measured_mean"] > 2 * methods["dgc99"]["bytes"]["measured_last"]
    )
    # Dense ZeRO-1 fp32 sends 4n bytes per rank at W=2; DGC-99 8 bytes (index + value) per
    # selected entry, 1% of n: a ratio of 50 in the steady state.
    ratio = methods["adams"]["bytes"]["measured_last"] / methods["dgc99"]["bytes"]["measured_last"]
    assert 45 < ratio < 55
    assert doc["unigram"]["tokens"] > 100_000 and 0 < doc["unigram"]["nats"] < 10
    out = tmp_path / "out"
    assert json.loads((out / "frontier.json").read_text())["methods"][1]["label"] == "DGC-99"
    assert (out / "frontier.png").stat().st_size > 10_000
    assert (out / "loss_vs_bytes.png").stat().st_size > 1000
    text = (out / "frontier.md").read_text()
    assert "DGC-99" in text and f"{doc['unigram']['nats']:.3f} nats/token" in text
