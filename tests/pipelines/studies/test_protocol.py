"""The verdict's protocol: code stamps, the lr chosen over seeds, the code version a table
is made of."""

from __future__ import annotations

import math
from pathlib import Path

from pipelines.studies.protocol import (
    UNSTAMPED,
    choose_lr,
    code_classes,
    code_version,
    load_equivalences,
    record_equivalence,
    step_code,
    verdict_code,
)


def test_code_version_records_the_commit_dirtiness_and_the_step_sources(
    tmp_path: Path, commit_all
) -> None:
    (tmp_path / "scape").mkdir()
    (tmp_path / "scape" / "shard.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    commit_all(tmp_path)
    first = code_version(tmp_path)
    assert len(first["commit"]) == 40 and first["dirty"] is False
    # A doc change: a new commit, the same step code (no re-run needed).
    (tmp_path / "README.md").write_text("more docs\n")
    assert code_version(tmp_path)["dirty"] is True
    commit_all(tmp_path, "docs")
    second = code_version(tmp_path)
    assert second["commit"] != first["commit"] and second["step_code"] == first["step_code"]
    # A change to the step's source: a new code version.
    (tmp_path / "scape" / "shard.py").write_text("x = 2\n")
    assert step_code(tmp_path) != first["step_code"]
    assert code_version(tmp_path / "scape" / "..")["dirty"] is True


def test_code_version_outside_git_has_no_commit(tmp_path: Path) -> None:
    assert code_version(tmp_path)["commit"] is None


def test_choose_lr_over_seeds_and_grid_closure() -> None:
    finals = {0.5: {0: 4.1, 1: 4.0}, 1.0: {0: 4.0, 1: 4.4}, 2.0: {0: 4.6, 1: 4.5}}
    choice = choose_lr(finals)
    assert choice.lr == 0.5 and not choice.closed  # best mean at the low edge: open
    finals[0.25] = {0: 4.3, 1: 4.2}
    assert choose_lr(finals).closed and choose_lr(finals).lr == 0.5
    finals[0.5][1] = math.inf  # diverged on one seed: its mean is inf
    assert choose_lr(finals).lr == 1.0
    assert choose_lr({}) is None


def test_verdict_code_prefers_stamped_runs_with_the_most_runs() -> None:
    assert verdict_code(["a", "b", "b", UNSTAMPED, UNSTAMPED, UNSTAMPED]) == "b"
    assert verdict_code([UNSTAMPED]) == UNSTAMPED
    assert verdict_code([]) is None


def test_replays_join_code_versions_into_classes_that_count_together(tmp_path: Path) -> None:
    """b replayed a, c replayed b: one class {a, b, c}; d alone. The class with the most runs
    wins (a+b+c: 4 against d: 3), named by its member with the most; a replay recorded
    twice is kept once (the later record)."""
    assert load_equivalences(tmp_path) == []
    record_equivalence(tmp_path, {"code": "b", "same_as": "a", "runs": ["x"], "commit": "1"})
    record_equivalence(tmp_path, {"code": "c", "same_as": "b", "runs": ["y"], "commit": "2"})
    record_equivalence(tmp_path, {"code": "c", "same_as": "b", "runs": ["z"], "commit": "3"})
    records = load_equivalences(tmp_path)
    assert [(r["code"], r["runs"]) for r in records] == [("b", ["x"]), ("c", ["z"])]
    classes = code_classes(records)
    assert classes["a"] == classes["c"] == {"a", "b", "c"} and "d" not in classes
    codes = ["a", "b", "b", "c", "d", "d", "d"]
    assert verdict_code(codes) == "d" and verdict_code(codes, classes) == "b"


def test_every_step_source_exists() -> None:
    """A renamed or moved file would silently drop out of the code version's digest."""
    from pipelines.studies.protocol import STEP_SOURCES

    root = Path(__file__).resolve().parents[3]
    assert [s for s in STEP_SOURCES if not (root / s).is_file()] == []
