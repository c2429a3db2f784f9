"""The host replay names the host and says, in one line, what to run first."""

import pytest

from pipelines.studies.host_replay import host_name, replay_on_this_host, replay_sets_here


def test_the_host_is_named_by_cpu_and_vector_width():
    name = host_name()
    assert name.endswith(("AVX-512", "AVX2", "no AVX2")) and ", " in name


def test_without_todays_replays_it_says_to_run_them_first(tmp_path):
    with pytest.raises(SystemExit, match="run `make quality-replay` first"):
        replay_on_this_host("HEAD", data_dir=tmp_path, replay_dir=tmp_path / "replays",
                            runs_dir=tmp_path / "runs")  # fmt: skip


def test_a_commit_of_todays_own_version_is_refused_in_one_line(tmp_path, monkeypatch):
    """Naming a commit that already has today's step files would replay today's code against
    itself: refused before anything runs."""
    import json

    from pipelines.studies import host_replay

    monkeypatch.setattr(host_replay, "step_code", lambda *a, **k: "same")
    run = tmp_path / "replays" / "same" / "m__adams__s0__t1.jsonl"
    run.parent.mkdir(parents=True)
    run.write_text(json.dumps({"event": "header"}) + "\n" + json.dumps({"event": "final"}) + "\n")
    with pytest.raises(SystemExit, match="is of code version `same`, today's own") as err:
        replay_on_this_host("HEAD", data_dir=tmp_path, replay_dir=tmp_path / "replays",
                            runs_dir=tmp_path / "runs")  # fmt: skip
    assert "\n" not in str(err.value)


def test_sets_without_stored_runs_are_named_in_one_line(tmp_path):
    """--sets names stored code versions; one with no runs in the folder is refused before
    anything runs, and the line names it and where to look."""
    from pipelines.studies.run_store import archive_runs

    run = tmp_path / "runs" / "aaa" / "m__adams__s0__t1.jsonl"
    run.parent.mkdir(parents=True)
    run.write_text('{"event": "header"}\n')
    archive_runs(tmp_path / "runs", "aaa")
    with pytest.raises(SystemExit, match="--sets bbb: no stored runs") as err:
        replay_sets_here(["aaa", "bbb"], data_dir=tmp_path, replay_dir=tmp_path / "replays",
                         runs_dir=tmp_path / "runs")  # fmt: skip
    assert "\n" not in str(err.value) and "aaa" not in str(err.value).split(":")[1]
