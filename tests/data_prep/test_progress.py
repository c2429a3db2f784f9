"""Progress: a bar on a terminal, plain lines in a log (data_prep.progress)."""

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from data_prep.progress import EVERY_S_ENV, Progress, plain_interval_s

REPO = Path(__file__).resolve().parents[2]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_progress_is_plain_lines_with_the_figures():
    log = io.StringIO()
    with Progress(4, "run", unit="step", stream=log, every_s=0) as progress:
        for step in range(1, 5):
            progress.advance_to(step, loss=9.0 - step, val=None if step < 3 else 7.25)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert len(lines) == 4  # one per update at every_s=0; close adds none when just printed
    assert lines[0].startswith("run: 1/4 step (25%), loss=8.000, ")
    assert "val=" not in lines[0]  # no validation yet: left out, not "None"
    assert lines[-1].startswith("run: 4/4 step (100%), loss=5.000, val=7.250, ")
    assert " step/s, elapsed 0:0" in lines[-1]


def test_plain_lines_come_at_most_once_per_interval_plus_the_end():
    log = io.StringIO()
    progress = Progress(1000, "prepare", unit="doc", stream=log, every_s=3600)
    for _ in range(1000):
        progress.update()
    progress.close()
    progress.update()  # after close: nothing more
    lines = log.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "prepare: 1/1000 doc (0%)",
        "prepare: 1000/1000 doc (100%)",
    ]


def test_a_resumed_count_starts_at_initial_and_prints_nothing_without_updates():
    log = io.StringIO()
    Progress(10, "run", stream=log, initial=6).close()
    assert log.getvalue() == ""
    with Progress(10, "run", stream=log, initial=6, every_s=0) as progress:
        progress.update()
    assert log.getvalue().startswith("run: 7/10 it (70%)")


def test_on_a_terminal_progress_is_a_bar_unless_asked_for_lines():
    screen = _Terminal()
    with Progress(3, "run", unit="step", stream=screen) as progress:
        progress.advance_to(3, loss=1.5)
    assert "\r" in screen.getvalue() and "loss=1.500" in screen.getvalue()

    screen = _Terminal()
    with Progress(3, "rank0", stream=screen, bar=False, every_s=0) as progress:
        progress.update(3)
    assert "\r" not in screen.getvalue() and screen.getvalue().startswith("rank0: 3/3 it")


def test_disabled_progress_writes_nothing():
    log = io.StringIO()
    with Progress(3, "run", stream=log, enabled=False, every_s=0) as progress:
        progress.update(3, loss=1.0)
    assert log.getvalue() == ""


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(EVERY_S_ENV, raising=False)
    assert plain_interval_s() == 30.0
    monkeypatch.setenv(EVERY_S_ENV, "2.5")
    assert plain_interval_s() == 2.5
    monkeypatch.setenv(EVERY_S_ENV, "soon")
    with pytest.raises(ValueError, match="SCAPE_PROGRESS_EVERY_S='soon' is not a number"):
        plain_interval_s()


def test_a_run_redirected_to_a_file_has_no_carriage_returns_even_from_other_bars(tmp_path):
    # In a fresh process, as a stage runs: our progress and a third-party bar that passes
    # disable=False explicitly (as lm-eval's "Tokenizing inputs" does), output to a file.
    script = textwrap.dedent(
        """
        import io, sys
        from tqdm import tqdm
        from data_prep.progress import Progress, quiet_bars_without_terminal

        class Terminal(io.StringIO):
            def isatty(self):
                return True

        quiet_bars_without_terminal()
        quiet_bars_without_terminal()  # idempotent
        for _ in tqdm(range(50), desc="Tokenizing inputs", disable=False, mininterval=0):
            pass
        screen = Terminal()
        for _ in tqdm(range(5), file=screen, mininterval=0):  # a terminal keeps its bar
            pass
        print("terminal bar drawn:", "\\r" in screen.getvalue())
        with Progress(20, "train", unit="step", every_s=0) as progress:
            for step in range(1, 21):
                progress.advance_to(step, loss=1.0 / step)
        """
    )
    log = tmp_path / "log"
    with log.open("w") as out:
        subprocess.run([sys.executable, "-c", script], cwd=REPO, stdout=out, stderr=out, check=True)
    text = log.read_text()
    assert text.count("\r") == 0
    assert "Tokenizing inputs" not in text
    assert "terminal bar drawn: True" in text
    assert sum(line.startswith("train: ") for line in text.splitlines()) == 20


def test_a_count_that_steps_back_to_a_checkpoint_is_followed_on_both_displays():
    screen = _Terminal()
    with Progress(10, "run", stream=screen, initial=7) as progress:
        progress.advance_to(5)  # metrics past the checkpoint at 5 were dropped on resume
        progress.advance_to(6)
    assert " 6/10 " in screen.getvalue().split("\r")[-1]  # the bar's last frame
    log = io.StringIO()
    with Progress(10, "run", stream=log, initial=7, every_s=0) as progress:
        progress.advance_to(5)
        progress.advance_to(6)
    lines = log.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["run: 5/10 it", "run: 6/10 it"]
    assert ", 0.00 it/s," in lines[0]  # not a negative rate
