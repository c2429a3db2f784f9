"""The verdict's protocol, as code: which code a run ran, which lr a method is compared at,
and whether its lr grid is closed.

- Every run records the commit it ran, whether the tree had uncommitted changes, and a
  digest of the source that computes its numbers (:func:`code_version`). A table is made
  from the runs of one such code version only (:func:`verdict_code`), so a change to the
  step's arithmetic never sits in one cell beside the old numbers, while a change elsewhere
  (a report, a doc) forces no re-run; the report names every commit it drew on.
- Two code versions count as one where a replay showed it: :mod:`pipelines.studies.replay`
  re-ran one stored run per (model, method) of the older version with the newer code and got
  the same bits in every logged record (:func:`code_classes` reads what it recorded). A
  refactor of the step's files then forces no re-run; a change to the arithmetic fails it.
- A method's lr is the grid point with the lowest *mean* final loss over every seed of the
  cell, at the horizon the table reports (:func:`choose_lr`): a point one seed favours by
  luck, or one that diverges on another seed, is not chosen.
- A grid is closed when the chosen point has a run grid point on either side of it; a cell
  whose best point sits at the edge says "grid open", since a better lr may lie beyond.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipelines.training.provenance import git_version

__all__ = [
    "EQUIVALENCE_FILE",
    "UNSTAMPED",
    "LrChoice",
    "choose_lr",
    "code_classes",
    "code_version",
    "load_equivalences",
    "record_equivalence",
    "step_code",
    "verdict_code",
]

UNSTAMPED = "unstamped"  # runs made before runs recorded their commit
EQUIVALENCE_FILE = "equivalent.json"  # beside the code versions' folders, under runs/


# The source that computes a quality run's numbers: a change here may change them, a change
# elsewhere cannot (the report, the docs, the stages, the Megatron adapter's optimizer and
# the CPU layer, which maps device, stream and RNG-state calls: the run's numbers come from
# CPU torch). Conservative within these files: a rename also starts a new code version.
STEP_SOURCES = (
    *(f"scape/{name}.py" for name in ("adams", "basis", "comm", "config", "layout", "shard",
                                      "simulate", "step", "fused")),
    "scape/peers/dgc.py", "scape/megatron/models.py", "scape/megatron/train.py",
    "pipelines/training/loop.py", "pipelines/training/simulator_engine.py",
    "pipelines/training/checkpoint.py", "pipelines/training/metrics.py",
    *(f"pipelines/studies/{name}.py" for name in ("quality_run", "quality_data", "readings",
                                                   "quality_config")),
)  # fmt: skip


def step_code(repo: Path | str = ".", sources: Iterable[str] = STEP_SOURCES) -> str:
    """A 12-hex digest of ``sources`` (by path and content; the quality study's
    :data:`STEP_SOURCES` by default) and the torch and megatron-core versions: two runs with
    the same digest ran the same arithmetic, whatever commits they were made at, so their
    runs may share a table.
    (The same computation; on another host the bits may still differ in the last places.)"""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(repo)
    h = hashlib.sha256()
    for source in sources:
        path = root / source
        if path.is_file():
            h.update(source.encode() + b"\0" + path.read_bytes() + b"\0")
    for package in ("torch", "megatron-core"):
        try:
            h.update(f"{package}=={version(package)}".encode())
        except PackageNotFoundError:
            h.update(f"{package} missing".encode())
    return h.hexdigest()[:12]


def code_version(repo: Path | str = ".") -> dict[str, object]:
    """``{"commit": <sha> or None, "dirty": bool, "step_code": <digest>}`` of ``repo``
    (:func:`~pipelines.training.provenance.git_version` and :func:`step_code`)."""
    return {**git_version(repo), "step_code": step_code(repo)}


def verdict_code(
    codes: Iterable[str], classes: Mapping[str, frozenset[str]] | None = None
) -> str | None:
    """The code version whose runs the tables are made of: the one whose class (``classes``,
    :func:`code_classes`; each version alone by default) has the most runs, named by its
    member with the most (ties: the one listed first). ``codes`` is each run's step code,
    :data:`UNSTAMPED` for runs without one; stamped runs win over unstamped ones whatever
    their count."""
    counts = Counter(codes)
    stamped = {c: n for c, n in counts.items() if c != UNSTAMPED}
    pool = stamped or dict(counts)
    if not pool:
        return None
    classes = classes or {}
    size = {c: sum(pool.get(m, 0) for m in classes.get(c, {c})) for c in pool}
    return max(pool, key=lambda c: (size[c], pool[c]))


def load_equivalences(runs_dir: Path) -> list[dict[str, object]]:
    """The replays recorded under ``runs_dir`` (:data:`EQUIVALENCE_FILE`; [] when none): each
    ``{"code", "same_as", "runs", "commit", "dirty"}``: code version ``code`` (at ``commit``)
    replayed ``runs`` of ``same_as`` and got the same bits."""
    path = Path(runs_dir) / EQUIVALENCE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def record_equivalence(runs_dir: Path, record: dict[str, object]) -> None:
    """Add one replay's record to :data:`EQUIVALENCE_FILE` (kept sorted, one per pair)."""
    pairs = {(r["code"], r["same_as"]): r for r in load_equivalences(runs_dir)}
    pairs[(record["code"], record["same_as"])] = record
    path = Path(runs_dir) / EQUIVALENCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [pairs[k] for k in sorted(pairs)]  # type: ignore[type-var]
    path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def code_classes(equivalences: Iterable[Mapping[str, object]]) -> dict[str, frozenset[str]]:
    """Every code version named in ``equivalences`` -> the set of versions a chain of replays
    joins it to (itself included). Versions not named are alone in their class."""
    parent: dict[str, str] = {}

    def root(c: str) -> str:
        while parent.setdefault(c, c) != c:
            c = parent[c]
        return c

    for r in equivalences:
        parent[root(str(r["code"]))] = root(str(r["same_as"]))
    members: dict[str, set[str]] = {}
    for c in list(parent):
        members.setdefault(root(c), set()).add(c)
    return {c: frozenset(members[root(c)]) for c in parent}


@dataclass(frozen=True)
class LrChoice:
    lr: float
    mean_loss: float  # over the cell's seeds; inf when a seed diverged
    seeds: tuple[int, ...]
    closed: bool  # a run grid point on each side of ``lr``
    grid: tuple[float, ...]  # the points eligible (run on every seed)


def choose_lr(finals: Mapping[float, Mapping[int, float]]) -> LrChoice | None:
    """The lr with the lowest mean final loss over the cell's seeds.

    ``finals[lr][seed]`` is a run's final validation loss (``math.inf`` when it diverged).
    The cell's seeds are every seed run at any of its lrs; only lrs run on all of them are
    eligible, so every candidate is averaged over the same seeds. None when no lr is."""
    seeds = sorted({s for per_seed in finals.values() for s in per_seed})
    grid = tuple(sorted(lr for lr, per_seed in finals.items() if set(per_seed) >= set(seeds)))
    if not grid:
        return None
    means = {lr: _mean([finals[lr][s] for s in seeds]) for lr in grid}
    lr = min(grid, key=lambda x: (means[x], x))
    closed = grid[0] < lr < grid[-1]
    return LrChoice(lr, means[lr], tuple(seeds), closed, grid)


def _mean(values: list[float]) -> float:
    return math.inf if any(not math.isfinite(v) for v in values) else statistics.fmean(values)
