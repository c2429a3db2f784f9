"""Fixtures shared across the test directories."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def prepared_default():
    """The offline default corpus in <repo>/data, prepared once (the stage is idempotent)."""
    subprocess.run(
        [sys.executable, "-m", "pipelines.prepare", "progress=false"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
