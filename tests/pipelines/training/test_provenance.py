"""Every run records the code and host that made it; a resumed run keeps its first record
and lists each later code version or host."""

from __future__ import annotations

import json
from pathlib import Path

import pipelines.training.provenance as provenance
from pipelines.training.provenance import (
    PROVENANCE_FILE,
    git_version,
    host_build,
    record_provenance,
)


def test_a_run_records_its_commit_and_a_resume_at_other_code(tmp_path: Path, commit_all) -> None:
    repo, run_dir = tmp_path / "repo", tmp_path / "run"
    repo.mkdir()
    run_dir.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    commit_all(repo)
    first = record_provenance(run_dir, repo)
    assert first == {**git_version(repo), "host": host_build(), "resumed": []}
    assert len(first["commit"]) == 40
    assert record_provenance(run_dir, repo) == first  # resumed at the same code: unchanged
    (repo / "a.py").write_text("x = 2\n")  # uncommitted change: another code version
    record = record_provenance(run_dir, repo)
    assert record["commit"] == first["commit"] and record["dirty"] is False
    assert record["resumed"] == [{"commit": first["commit"], "dirty": True, "host": host_build()}]
    assert json.loads((run_dir / PROVENANCE_FILE).read_text()) == record


def test_a_resume_on_another_host_is_listed(tmp_path: Path, commit_all, monkeypatch) -> None:
    repo, run_dir = tmp_path / "repo", tmp_path / "run"
    repo.mkdir()
    run_dir.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    commit_all(repo)
    first = record_provenance(run_dir, repo)
    other = {**host_build(), "cpu": "Other CPU 9000, AVX-512"}
    monkeypatch.setattr(provenance, "host_build", lambda: other)
    record = record_provenance(run_dir, repo)
    assert record["host"] == first["host"] != other  # the first host stays the run's host
    assert record["resumed"] == [{**git_version(repo), "host": other}]


def test_the_host_names_cpu_and_torch_build() -> None:
    import torch

    host = host_build()
    assert host["cpu"].endswith(("AVX-512", "AVX2", "no AVX2")) and ", " in host["cpu"]
    assert host["torch"] == torch.__version__ and host["cpus"] >= 1
    assert host["cuda"] == torch.version.cuda  # None for the CPU build this suite pins


def test_outside_git_the_commit_is_none(tmp_path: Path) -> None:
    assert git_version(tmp_path) == {"commit": None, "dirty": False}


def test_changed_results_are_not_dirty_code(tmp_path: Path, commit_all) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t.md").write_text("a\n")
    (tmp_path / "a.py").write_text("x = 1\n")
    commit_all(tmp_path)
    (tmp_path / "results" / "t.md").write_text("b\n")  # a regenerated table
    assert git_version(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_version(tmp_path)["dirty"] is True
