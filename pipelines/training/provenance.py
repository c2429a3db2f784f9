"""Which code made a run: the git commit of the checkout, and whether its tracked files had
uncommitted changes. Every run records it (the pretrain stage in ``provenance.json`` beside
``config.yaml``, the quality study in each run's header), so a table can name the commit
its numbers come from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["PROVENANCE_FILE", "REPO_ROOT", "git_version", "record_provenance"]

PROVENANCE_FILE = "provenance.json"
REPO_ROOT = Path(__file__).resolve().parents[2]


def git_version(repo: Path | str = REPO_ROOT) -> dict[str, Any]:
    """``{"commit": <sha> or None, "dirty": bool}``. ``dirty`` counts tracked files outside
    ``results/`` only (an output changes no code); ``commit`` is None outside a checkout."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                                 check=True, timeout=30)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    # results/ is what runs write, not code: regenerating a table must not mark it dirty
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results")
    status = status if commit else None
    return {"commit": commit or None, "dirty": bool(status)}


def record_provenance(run_dir: Path, repo: Path | str = REPO_ROOT) -> dict[str, Any]:
    """Write ``run_dir/provenance.json`` for a new run; a resumed run keeps its first record
    and lists every later code version it was resumed at (a run resumed at another commit is
    then visible as such). Returns the record."""
    path = run_dir / PROVENANCE_FILE
    now = git_version(repo)
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if record is None:
        record = {**now, "resumed": []}
    elif now != {k: record.get(k) for k in now}:
        record["resumed"] = [*record.get("resumed", []), now]
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
