"""The run table reads finished runs from a folder or from their packed records alike."""

import json
import tarfile

import pytest

from pipelines.studies.run_table import read_runs, table


def _run(root, name, final, curve):
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"final_val_loss": final}))
    lines = [json.dumps({"step": s, "loss": 9.0, "val_loss": v}) for s, v in curve.items()]
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_folder_and_archive_give_the_same_table(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "adams", 4.0, {400: 5.0, 800: 4.5})
    _run(runs, "dgc", 5.0, {400: 6.0})
    (runs / "unfinished").mkdir()
    archive = tmp_path / "runs.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(runs, arcname="runs")
    text = table(read_runs(runs), [400, 800], "adams")
    assert text == table(read_runs(archive), [400, 800], "adams")
    assert "| adams | 5.000 | 4.500 | 4.000 | reference |" in text
    assert "| dgc | 6.000 | - | 5.000 | +25.0% |" in text
    with pytest.raises(SystemExit, match="'sgd' is not one of the runs: adams, dgc"):
        table(read_runs(runs), [400], "sgd")
