"""Fixtures shared across the test directories."""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Without a GPU, Triton's kernels (scape.fused) run under its interpreter: set before anything
# imports triton, and inherited by the ranks the tests spawn.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the environment tests run without torch
    pass


@pytest.fixture(scope="session")
def prepared_default():
    """The offline default corpus in <repo>/data, prepared once (the stage is idempotent).
    A lock file makes the test workers that share the checkout (pytest -n) wait for the one
    that prepares it rather than write the same files at once."""
    (REPO / "data").mkdir(exist_ok=True)
    with open(REPO / "data" / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(
            [sys.executable, "-m", "pipelines.prepare", "progress=false"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
