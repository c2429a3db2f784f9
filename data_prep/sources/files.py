"""Local corpus files: .txt, .jsonl (each optionally .gz) and .parquet.

Every file is opened and hashed before any tokenization starts, so a missing or
unreadable file fails the run at once, and the content hash becomes the source
fingerprint (the same files anywhere give the same fingerprint).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from data_prep.errors import DataPrepError

SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".parquet")
_CHUNK = 1 << 20


def resolve_paths(patterns: list[str]) -> list[Path]:
    """Expand globs; every pattern must match at least one regular file."""
    found: dict[Path, None] = {}  # insertion-ordered set
    for pattern in patterns:
        matches = sorted(glob.glob(str(Path(pattern).expanduser()), recursive=True))
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            raise DataPrepError(
                f"data.paths: no file matches {pattern!r} (cwd {Path.cwd()}); fix the path or glob"
            )
        for f in files:
            if not f.name.endswith(SUFFIXES):
                raise DataPrepError(
                    f"unsupported corpus file {f}; use one of {', '.join(SUFFIXES)}"
                )
            found[f] = None
    return list(found)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
    except OSError as err:
        raise DataPrepError(
            f"cannot read corpus file {path}: {err.strerror}; fix its permissions or drop it from data.paths"
        ) from err
    return digest.hexdigest()


def files_fingerprint(paths: list[Path]) -> list[dict[str, object]]:
    return [{"name": p.name, "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in paths]


def iter_file_documents(paths: list[Path], text_field: str, separator: str | None) -> Iterator[str]:
    for path in paths:
        name = path.name
        try:
            if name.endswith(".parquet"):
                yield from _parquet_documents(path, text_field)
            elif name.endswith((".jsonl", ".jsonl.gz")):
                with _open_text(path) as stream:
                    yield from _jsonl_documents(stream, path, text_field)
            else:
                with _open_text(path) as stream:
                    yield from _text_documents(stream, separator)
        except UnicodeDecodeError as err:
            raise DataPrepError(
                f"corpus file {path} is not UTF-8 text ({err.reason} at byte {err.start}); re-encode it"
            ) from err
        except (OSError, EOFError) as err:
            raise DataPrepError(
                f"cannot read corpus file {path}: {err}; check the file is complete and readable"
            ) from err


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    # newline="" keeps \r\n as written, so the tokenized text is exactly the file's
    return open(path, encoding="utf-8", newline="")


def _text_documents(stream: IO[str], separator: str | None) -> Iterator[str]:
    if separator is None:
        yield stream.read()
        return
    # split on the separator chunk by chunk, so a multi-GB file never sits in memory
    pending = ""
    while chunk := stream.read(_CHUNK):
        parts = (pending + chunk).split(separator)
        pending = parts.pop()
        yield from parts
    yield pending


def _jsonl_documents(stream: IO[str], path: Path, text_field: str) -> Iterator[str]:
    for line_no, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataPrepError(
                f"{path} line {line_no}: not valid JSON ({err.msg}); fix the line or drop the file"
            ) from err
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise DataPrepError(
                f"{path} line {line_no}: no string field {text_field!r}; set data.text_field"
            )
        yield text


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # comes with `datasets`; imported only for parquet input

    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises its own ArrowInvalid for damaged files
        raise DataPrepError(f"cannot read parquet file {path}: {err}; check the file") from err
    if text_field not in parquet.schema_arrow.names:
        raise DataPrepError(
            f"{path}: no column {text_field!r} (has {parquet.schema_arrow.names}); set data.text_field"
        )
    for batch in parquet.iter_batches(columns=[text_field], batch_size=1024):
        yield from (t for t in batch.column(0).to_pylist() if t is not None)
