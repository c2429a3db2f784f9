"""Helpers for the data preparation tests (a module, not conftest, so tests can import it)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

from data_prep.config import DataConfig, PrepareConfig, SourceKind, TokenizerConfig, TokenizerKind

# 16 articles (~0.5 MB of text) and a 512-entry BPE keep every run around a second
SLICE_DOCUMENTS = 16


def slice_config(output_root: Path, **overrides: object) -> PrepareConfig:
    cfg = PrepareConfig(
        data=DataConfig(
            name="enwiki_slice",
            kind=SourceKind.embedded,
            embedded="enwiki_sample",
            max_documents=SLICE_DOCUMENTS,
            split_ratios=[0.8, 0.1, 0.1],
        ),
        tokenizer=TokenizerConfig(name="bytebpe512", kind=TokenizerKind.bytebpe, vocab_size=512),
        output_root=str(output_root),
        num_proc=1,
        progress=False,
    )
    return replace(cfg, **overrides)


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (hidden leftovers included), by relative name."""
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def dead_pid() -> int:
    """A process id that no process has now (to fake a killed run's leftovers)."""
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1
