"""Multi-rank checkpoints: atomic, hash-checked, the last K kept, the newest valid one found.

Layout of one checkpoint (ZeRO-style: each rank saves its own optimizer shard):

    <run>/checkpoints/step_00000050/
        manifest.json    step, world size, sha256 of every file (written last)
        common.pt        rank 0: model weights, LR scheduler, anything rank-independent
        rank00000.pt     rank r: its RNG and what of its optimizer state is not sharded
        optimizer/       what the optimizer saves through Megatron's distributed
                         checkpointing (SCAPE: its moments, fp32 params and masks)

All ranks write into ``.step_00000050.partial/``; rank 0 renames it to the final name only
after every rank has finished and the manifest is written. A killed run therefore leaves a
partial directory (removed on the next save) and never a half-written checkpoint under a
final name. Loading checks hashes and falls back to the previous checkpoint when the newest
is corrupt. ``torch.load`` always runs with ``weights_only=True``.

:func:`save_training_state` and :func:`restore_training_state` put a training run in it: the
engine's model and optimizer, the lr schedule, the RNG, and whatever else the run keeps in
``common.pt``. The pretrain stage (``<run>/checkpoints/``) and the quality studies
(``<run_id>.ckpt/`` beside the run's log) save and resume through them.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "CheckpointError",
    "find_latest_valid",
    "load_rank_files",
    "restore_training_state",
    "save_checkpoint",
    "save_training_state",
    "step_of",
]

PREFIX = "step_"


class CheckpointError(RuntimeError):
    pass


def _name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _rank_file(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def save_checkpoint(
    root: Path,
    step: int,
    *,
    common: dict[str, Any] | None,
    rank_state: dict[str, Any] | Callable[[Path], dict[str, Any]],
    keep: int,
) -> Path:
    """Collective: every rank calls it; rank 0 passes ``common``, others None.

    ``rank_state`` may be a callable: every rank calls it with the directory being written
    (collectively, so it may save sharded state there) and it returns the rank's file.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    final = root / _name(step)
    partial = root / f".{_name(step)}.partial"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    dist.barrier()
    if callable(rank_state):
        rank_state = rank_state(partial)
    torch.save(rank_state, partial / _rank_file(rank))
    if rank == 0:
        torch.save(common or {}, partial / "common.pt")
    dist.barrier()
    if rank == 0:
        files = {p.relative_to(partial).as_posix(): _sha256(p)
                 for p in sorted(partial.rglob("*")) if p.is_file()}  # fmt: skip
        manifest = {"step": step, "world_size": world, "files": files, "created": time.time()}
        (partial / "manifest.json").write_text(json.dumps(manifest, indent=1))
        if final.exists():  # the same step saved again (e.g. at the end of a resumed run)
            shutil.rmtree(final)
        partial.rename(final)
        _prune(root, keep)
    dist.barrier()
    return final


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob(f"{PREFIX}*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f".{PREFIX}*.partial"):
        shutil.rmtree(stale, ignore_errors=True)


def _problem(path: Path, world_size: int) -> str | None:
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        return "no manifest.json (interrupted while saving?)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return f"unreadable manifest.json ({err})"
    if manifest.get("world_size") != world_size:
        return (
            f"saved with world size {manifest.get('world_size')}, this run has {world_size}; "
            "resume with the same number of ranks (the optimizer state is sharded per rank)"
        )
    expected = {"common.pt", *(_rank_file(r) for r in range(world_size))}
    if not expected <= set(manifest.get("files", {})):
        return "manifest lists the wrong files"
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if _sha256(file) != digest:
            return f"{name} does not match its sha256 (corrupt or truncated)"
    return None


def find_latest_valid(root: Path, world_size: int, *, log=print) -> Path | None:
    """The newest checkpoint whose files all match their manifest; corrupt ones are reported."""
    if not root.is_dir():
        return None
    for path in sorted((p for p in root.glob(f"{PREFIX}*") if p.is_dir()), reverse=True):
        problem = _problem(path, world_size)
        if problem is None:
            return path
        if "world size" in problem:
            raise CheckpointError(f"{path}: {problem}")
        log(f"warning: skipping checkpoint {path}: {problem}; trying the previous one")
    return None


def load_rank_files(path: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(common, this rank's state), weights only."""
    common = torch.load(path / "common.pt", map_location="cpu", weights_only=True)
    mine = torch.load(path / _rank_file(rank), map_location="cpu", weights_only=True)
    return common, mine


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_training_state(
    training: Any,
    scheduler: Any,
    step: int,
    root: Path,
    *,
    keep: int,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Collective: checkpoint ``step`` of a run under ``root``. ``training``: an engine
    (:class:`pipelines.training.engine_base.EngineCommon`); ``scheduler``: its lr schedule;
    ``extra``: more of rank 0's state for ``common.pt``."""
    training.sync_params()
    common = None
    if dist.get_rank() == 0:
        common = {"model": training.model_state_dict(), "scheduler": scheduler.state_dict(),
                  "step": step, **(extra or {})}  # fmt: skip
    rng = _rng_state()  # before the optimizer's save, which must not move it

    def rank_state(directory: Path) -> dict[str, Any]:
        return {"optimizer": training.save_optimizer(directory / "optimizer"), "rng": rng,
                "step": step}  # fmt: skip

    return save_checkpoint(root, step, common=common, rank_state=rank_state, keep=keep)


def restore_training_state(training: Any, scheduler: Any, path: Path) -> dict[str, Any]:
    """Collective: load checkpoint ``path`` into ``training`` and ``scheduler`` and restore
    this rank's RNG; returns ``common.pt`` (the step, and the run's ``extra``)."""
    common, mine = load_rank_files(path, dist.get_rank())
    training.load_model_state_dict(common["model"])
    training.load_optimizer(path / "optimizer", mine["optimizer"])
    scheduler.load_state_dict(common["scheduler"])
    _set_rng_state(mine["rng"])
    return common
