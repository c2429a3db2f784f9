"""`make quality-replay-host OLDER=<commit>`: a replay whose two sides ran on one host.

`make quality-replay` compares today's code, run here, with bits stored from whatever host
made the older runs. On a host with another CPU the older code itself can miss its own
stored bits (2026-12-04, AMD EPYC with AVX-512: commit 298e163 missed its 300-step runs in
the last places), so a failed replay there says nothing about the change. This makes both
sides here:

1. today's code re-runs the older version's replay set: the runs `make quality-replay` left
   in its ``replay_dir`` (run it first), or, with ``--sets V1,V2``, the replay sets of those
   stored code versions only, made here first (`make quality-replay` replays every version
   it cannot join, and cross-host stored bits never join, so it goes on to the 3,000-step
   versions' runs, minutes each; the cheap sets are enough to compare two versions here);
2. the older commit, checked out in a temporary git worktree, replays those runs with its
   own code (its own ``quality_study replay=true`` on a copy of them, on this host);
3. where the older code gives every logged bit of today's runs, the two versions are
   recorded as one in ``results/quality/runs/equivalent.json``, the record naming the host
   and the older commit; otherwise nothing is recorded and the first difference is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipelines.studies.protocol import load_equivalences, record_equivalence, step_code
from pipelines.studies.run_index import read_run
from pipelines.studies.run_store import run_texts
from pipelines.training.provenance import cpu_name

__all__ = ["host_name", "main", "replay_on_this_host", "replay_sets_here"]

REPO = Path(__file__).resolve().parents[2]


def host_name() -> str:
    """The CPU model and its widest vector extension: what decides the last bits here."""
    return cpu_name()


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def _replay(repo: Path, out: Path, *, data_dir: Path, replay_dir: Path) -> None:
    """``repo``'s own code replays every stored code version under ``out/runs``."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    subprocess.run([sys.executable, "-m", "pipelines.quality_study", "replay=true",
                    f"out_dir={out}", f"data_dir={Path(data_dir).resolve()}",
                    f"replay_dir={Path(replay_dir).resolve()}"], cwd=repo, env=env,
                   check=True)  # fmt: skip


def replay_sets_here(sets: list[str], *, data_dir: Path, replay_dir: Path, runs_dir: Path) -> None:
    """Step 1 for the stored code versions ``sets`` only: today's code replays their replay
    sets (one run per model and variant) into ``replay_dir/<today's version>``, from a
    temporary study folder that holds copies of just their runs."""
    with tempfile.TemporaryDirectory(prefix="host_replay_sets_") as tmp:
        out, found = Path(tmp) / "out", set()
        for name, text in run_texts(runs_dir):
            version = name.split("/", 1)[0] if "/" in name else None
            if version in sets:
                (out / "runs" / name).parent.mkdir(parents=True, exist_ok=True)
                (out / "runs" / name).write_text(text, encoding="utf-8")
                found.add(version)
        missing = [v for v in sets if v not in found]
        if missing:
            raise SystemExit(f"host replay: --sets {','.join(missing)}: no stored runs of that "
                             f"code version in {runs_dir}; name versions whose archives are "
                             f"there (<version>.tar.xz)")  # fmt: skip
        print(f"host replay: today's code replays the runs of {', '.join(sets)}", flush=True)
        _replay(REPO, out, data_dir=data_dir, replay_dir=replay_dir)


def replay_on_this_host(older: str, *, data_dir: Path, replay_dir: Path,
                        runs_dir: Path) -> dict | None:  # fmt: skip
    """Steps 2-3 of the module docstring; returns the recorded equivalence, or None."""
    current = step_code(REPO)
    ours = sorted(p for p in (replay_dir / current).glob("*.jsonl") if read_run(p) is not None)
    if not ours:
        raise SystemExit(
            f"host replay: no finished replay of code version {current} in {replay_dir / current}:"
            " run `make quality-replay` first (its runs are today's side), or name the stored"
            " versions to replay here with --sets (make quality-replay-host SETS=...)"
        )
    commit = _git("rev-parse", "--verify", f"{older}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="host_replay_") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            if step_code(tree) == current:
                raise SystemExit(
                    f"host replay: commit {commit[:10]} is of code version `{current}`, today's "
                    "own: name a commit of the older version (git log -- the step's files)"
                )
            (out / "runs" / current).mkdir(parents=True)
            for path in ours:
                shutil.copy2(path, out / "runs" / current / path.name)
            print(f"host replay: commit {commit[:10]} replays {len(ours)} runs of `{current}` "
                  f"on this host ({host_name()})", flush=True)  # fmt: skip
            _replay(tree, out, data_dir=data_dir, replay_dir=Path(tmp) / "replays")
            found = [r for r in load_equivalences(out / "runs") if r["same_as"] == current]
        finally:
            _git("worktree", "remove", "--force", str(tree))
    if not found:
        print(f"host replay: commit {commit[:10]} does NOT compute what `{current}` did on this "
              "host; nothing recorded", flush=True)  # fmt: skip
        return None
    record = {**found[0], "commit": commit, "host": host_name(),
              "how": "the older commit replayed the newer version's runs, both made on this host"}  # fmt: skip
    record_equivalence(runs_dir, record)
    print(f"host replay: `{record['code']}` (commit {commit[:10]}) computes what `{current}` "
          f"does on this host; recorded in {runs_dir / 'equivalent.json'}", flush=True)  # fmt: skip
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("older", help="a commit whose code version made stored runs")
    parser.add_argument("--data-dir", type=Path, default=Path("data/enwiki_sample__bytebpe1k"))
    parser.add_argument("--replay-dir", type=Path, default=Path("outputs/quality_replay"))
    parser.add_argument("--runs-dir", type=Path, default=Path("results/quality/runs"))
    parser.add_argument("--sets", default="",
                        help="comma-separated stored code versions whose replay sets today's "
                             "code makes first (instead of `make quality-replay`)")  # fmt: skip
    args = parser.parse_args(argv)
    sets = [v for v in args.sets.split(",") if v]
    if sets:
        replay_sets_here(sets, data_dir=args.data_dir, replay_dir=args.replay_dir,
                         runs_dir=args.runs_dir)  # fmt: skip
    record = replay_on_this_host(args.older, data_dir=args.data_dir, replay_dir=args.replay_dir,
                                 runs_dir=args.runs_dir)  # fmt: skip
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
