"""Run logs at rest: loose JSONL while a study writes them, one xz tar per folder once done.

A study writes each run as ``<runs dir>/<code version>/<run id>.jsonl`` (appended line by line,
renamed when the run ends, resumable). A finished folder is packed by :func:`archive_runs`
into ``<runs dir>/<code version>.tar.xz`` (its members keep their ``<code version>/<run id>``
names; the runs at the top, from before runs recorded their version, go into
``unstamped.tar.xz``), about a tenth of the bytes; everything that reads runs (the reports, the queue's and
the replay's "already finished?") goes through :func:`run_texts` and :func:`run_text`, which
see loose files and archives alike, so a packed run reads back as it was written.

Packing is deterministic (sorted members, zeroed times and owners, one xz preset): the same
runs give the same archive bytes, so re-packing an unchanged folder changes nothing in git.
"""

from __future__ import annotations

import io
import lzma
import tarfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

__all__ = ["ARCHIVE_SUFFIX", "UNSTAMPED_ARCHIVE", "archive_all", "archive_runs", "run_text",
           "run_texts"]  # fmt: skip

ARCHIVE_SUFFIX = ".tar.xz"
_PRESET = 9 | lzma.PRESET_EXTREME


@lru_cache(maxsize=64)
def _members(path: Path, mtime_ns: int) -> dict[str, str]:
    """An archive's JSONL members by name (cached per file version: reports read them often)."""
    del mtime_ns  # part of the cache key only
    with tarfile.open(path, "r:xz") as tar:
        return {
            m.name: tar.extractfile(m).read().decode("utf-8")
            for m in tar.getmembers()
            if m.isfile() and m.name.endswith(".jsonl")
        }


def _archive_members(path: Path) -> dict[str, str]:
    return _members(path.resolve(), path.stat().st_mtime_ns)


def run_texts(runs_dir: Path) -> Iterator[tuple[str, str]]:
    """``(name, text)`` of every run log under ``runs_dir``, sorted by name, the name relative
    to ``runs_dir`` (``<code version>/<run id>.jsonl``); loose files and archived ones."""
    runs_dir = Path(runs_dir)
    found = {p.relative_to(runs_dir).as_posix(): p for p in runs_dir.rglob("*.jsonl")}
    texts: dict[str, str] = {}
    for archive in sorted(runs_dir.rglob(f"*{ARCHIVE_SUFFIX}")):
        prefix = archive.parent.relative_to(runs_dir).as_posix()
        for name, text in _archive_members(archive).items():
            texts[f"{prefix}/{name}" if prefix != "." else name] = text
    for name in sorted({*found, *texts}):
        yield name, found[name].read_text(encoding="utf-8") if name in found else texts[name]


UNSTAMPED_ARCHIVE = f"unstamped{ARCHIVE_SUFFIX}"  # the runs at the top, made before versions


def _archive_for(runs_dir: Path, name: str) -> tuple[Path, str]:
    """Where a run named ``name`` is archived, and its member name there."""
    parts = Path(name).parts
    if len(parts) == 1:
        return runs_dir / UNSTAMPED_ARCHIVE, name
    return runs_dir / f"{parts[0]}{ARCHIVE_SUFFIX}", name


def run_text(runs_dir: Path, name: str) -> str | None:
    """The text of one run log (``<code version>/<run id>.jsonl``, or a bare ``<run id>.jsonl``
    at the top), loose or archived; None when there is none."""
    runs_dir = Path(runs_dir)
    loose = runs_dir / name
    if loose.is_file():
        return loose.read_text(encoding="utf-8")
    archive, member = _archive_for(runs_dir, name)
    return _archive_members(archive).get(member) if archive.is_file() else None


def archive_runs(runs_dir: Path, version: str | None) -> Path:
    """Pack the loose ``*.jsonl`` of ``runs_dir/<version>`` (``version`` None: those at the
    top) into its archive, merged with what the archive already holds, and delete them;
    returns the archive's path."""
    runs_dir = Path(runs_dir)
    folder = runs_dir if version is None else runs_dir / version
    target = runs_dir / (UNSTAMPED_ARCHIVE if version is None else f"{version}{ARCHIVE_SUFFIX}")
    runs = dict(_archive_members(target)) if target.is_file() else {}
    loose = sorted(folder.glob("*.jsonl"))
    for path in loose:
        runs[path.name if version is None else f"{version}/{path.name}"] = path.read_text(
            encoding="utf-8"
        )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(runs):
            data = runs[name].encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(buffer.getvalue(), format=lzma.FORMAT_XZ, preset=_PRESET)
    tmp = target.parent / f".{target.name}.tmp"
    tmp.write_bytes(packed)
    tmp.replace(target)
    for path in loose:
        path.unlink()
    if version is not None and not any(folder.iterdir()):
        folder.rmdir()
    return target


def archive_all(runs_dir: Path) -> list[Path]:
    """Pack every folder of loose runs under ``runs_dir`` and the loose runs at its top
    (``make quality-archive``); folders a study is still writing (a ``.partial`` or ``.lock``
    inside) are left as they are."""
    runs_dir = Path(runs_dir)
    done = []
    for folder in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        busy = any(folder.glob("*.partial")) or any(folder.glob("*.lock"))
        if not busy and any(folder.glob("*.jsonl")):
            done.append(archive_runs(runs_dir, folder.name))
    if any(runs_dir.glob("*.jsonl")):
        done.append(archive_runs(runs_dir, None))
    return done


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs_dirs", nargs="+", type=Path, help="folders of run logs")
    args = parser.parse_args(argv)
    for runs_dir in args.runs_dirs:
        if not runs_dir.is_dir():
            parser.error(f"{runs_dir} is not a folder of run logs")
        for path in archive_all(runs_dir):
            print(f"packed {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
