"""Run logs packed into archives read back as they were written, and packing is reproducible."""

import json

from pipelines.studies.run_index import load_runs
from pipelines.studies.run_store import archive_all, run_text, run_texts


def _log(run_id: str, final: bool = True) -> str:
    lines = [{"run_id": run_id, "model": "m", "variant": "v", "seed": 0}, {"step": 1, "loss": 2.0}]
    if final:
        lines.append({"event": "final", "final_val_loss": 1.5})
    return "".join(json.dumps(x) + "\n" for x in lines)


def _tree(root):
    runs = root / "runs"
    (runs / "abc").mkdir(parents=True)
    (runs / "abc" / "a.jsonl").write_text(_log("a"))
    (runs / "abc" / "b.jsonl").write_text(_log("b", final=False))
    (runs / "old.jsonl").write_text(_log("old"))
    return runs


def test_archived_runs_read_back_as_written(tmp_path):
    runs = _tree(tmp_path)
    before = list(run_texts(runs))
    packed = archive_all(runs)
    assert sorted(p.name for p in packed) == ["abc.tar.xz", "unstamped.tar.xz"]
    assert not (runs / "abc").exists() and not list(runs.glob("*.jsonl"))
    assert list(run_texts(runs)) == before
    assert run_text(runs, "abc/a.jsonl") == _log("a") and run_text(runs, "old.jsonl") == _log("old")
    assert run_text(runs, "abc/missing.jsonl") is None
    assert [r.header["run_id"] for r in load_runs(runs)] == ["a", "old"]  # b never finished


def test_packing_is_reproducible_and_merges(tmp_path):
    first = archive_all(_tree(tmp_path / "one"))
    second = archive_all(_tree(tmp_path / "two"))
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    runs = tmp_path / "one" / "runs"
    (runs / "abc").mkdir()
    (runs / "abc" / "c.jsonl").write_text(_log("c"))
    archive_all(runs)  # a new run joins the version's archive
    assert [name for name, _ in run_texts(runs)] == ["abc/a.jsonl", "abc/b.jsonl", "abc/c.jsonl",
                                                     "old.jsonl"]  # fmt: skip


def test_a_folder_being_written_is_left_loose(tmp_path):
    runs = _tree(tmp_path)
    (runs / "abc" / "d.jsonl.partial").write_text("{}\n")
    packed = archive_all(runs)
    assert [p.name for p in packed] == ["unstamped.tar.xz"] and (runs / "abc" / "a.jsonl").is_file()
