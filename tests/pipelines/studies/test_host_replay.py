"""The host replay names the host and says, in one line, what to run first."""

import pytest

from pipelines.studies.host_replay import host_name, replay_on_this_host


def test_the_host_is_named_by_cpu_and_vector_width():
    name = host_name()
    assert name.endswith(("AVX-512", "AVX2", "no AVX2")) and ", " in name


def test_without_todays_replays_it_says_to_run_them_first(tmp_path):
    with pytest.raises(SystemExit, match="run `make quality-replay` first"):
        replay_on_this_host("HEAD", data_dir=tmp_path, replay_dir=tmp_path / "replays",
                            runs_dir=tmp_path / "runs")  # fmt: skip
