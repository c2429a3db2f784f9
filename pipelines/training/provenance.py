"""Which code made a run, and where: the git commit of the checkout, whether its tracked files
had uncommitted changes, and the host (CPU model and vector extension, torch build). Every
run records it (the pretrain stage in ``provenance.json`` beside ``config.yaml``, the quality
study in each run's header), so a table can name the commit its numbers come from, and two
runs of one config that differ can be told apart by host (equal configs have moved by ~1%
between hosts, the size of some of the gaps reported)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["PROVENANCE_FILE", "REPO_ROOT", "cpu_name", "git_version", "host_build",
           "record_provenance"]  # fmt: skip

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


def cpu_name() -> str:
    """The CPU model and its widest vector extension: what decides a float's last bits here."""
    cpuinfo = Path("/proc/cpuinfo")
    info = cpuinfo.read_text() if cpuinfo.is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")  # fmt: skip
    vector = "AVX-512" if " avx512f" in info else "AVX2" if " avx2" in info else "no AVX2"
    return f"{model}, {vector}"


def host_build() -> dict[str, Any]:
    """The host and torch build a run ran on: ``{"cpu", "cpus", "machine", "python", "torch",
    "torch_git", "cuda"}`` (``cuda``: the CUDA torch was built for, None for a CPU build)."""
    import torch

    return {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_git": (torch.version.git_version or "")[:12] or None,
        "cuda": torch.version.cuda,
    }


def record_provenance(run_dir: Path, repo: Path | str = REPO_ROOT) -> dict[str, Any]:
    """Write ``run_dir/provenance.json`` for a new run; a resumed run keeps its first record
    and lists every later code version or host it was resumed at (a run resumed at another
    commit or on another host is then visible as such). Returns the record."""
    path = run_dir / PROVENANCE_FILE
    now = {**git_version(repo), "host": host_build()}
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if record is None:
        record = {**now, "resumed": []}
    elif now != {k: record.get(k) for k in now}:
        record["resumed"] = [*record.get("resumed", []), now]
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
