"""The peers study stage: a quick real run through pretrain (its report:
tests/pipelines/studies/test_peers_report.py)."""

import json
from pathlib import Path

from pipelines.peers_study import PeersStudyConfig, run

REPO = Path(__file__).resolve().parents[2]


def test_quick_study_runs_both_methods_through_pretrain(tmp_path, prepared_default, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = PeersStudyConfig(
        quick=True,
        output_root=str(tmp_path / "runs"),
        out_dir=str(tmp_path / "out"),
        progress=False,
    )
    results = {r.method: r for r in run(cfg)}
    assert set(results) == {"adams", "dgc99"}
    # Dense ZeRO-1 fp32 sends 4n bytes per rank at W=2; DGC-99 8 bytes (index + value) per
    # selected entry, 1% of n: a ratio of 50.
    ratio = results["adams"].bytes_per_step / results["dgc99"].bytes_per_step
    assert 45 < ratio < 55
    saved = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert [r["method"] for r in saved["results"]] == ["adams", "dgc99"]
    assert (tmp_path / "out" / "loss_vs_bytes.png").stat().st_size > 1000
    assert "DGC-99" in (tmp_path / "out" / "peers.md").read_text()
