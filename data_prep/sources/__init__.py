"""Corpus sources: one interface over the embedded default, local files and the hub.

`open_source(cfg)` checks the inputs (paths exist and are readable, the corpus is known)
and computes the source fingerprint without tokenizing anything; `Source.documents()`
then yields non-empty documents in a fixed order, as many times as asked (the trained
tokenizer needs one pass of its own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from data_prep.config import DataConfig, SourceKind
from data_prep.sources import embedded, files, hub


@dataclass
class Source:
    fingerprint: dict[str, Any]  # JSON-able description of exactly what is read
    raw_documents: Callable[[], Iterator[str]]
    max_documents: int | None
    known_count: int | None = None  # documents available, when cheap to know (progress bar)

    @property
    def sha256(self) -> str:
        return str(self.fingerprint["sha256"])

    def documents(self) -> Iterator[str]:
        """Non-empty documents, at most max_documents of them, in source order."""
        non_empty = (doc for doc in self.raw_documents() if doc.strip())
        return islice(non_empty, self.max_documents)

    @property
    def expected_count(self) -> int | None:
        counts = [c for c in (self.known_count, self.max_documents) if c is not None]
        return min(counts) if counts else None


def open_source(data: DataConfig) -> Source:
    if data.kind == SourceKind.embedded:
        name = str(data.embedded)
        info = embedded.corpus_info(name)
        path = embedded.corpus_path(name)
        described: dict[str, Any] = {
            "kind": "embedded",
            "corpus": name,
            "package": info.package,
            "resource": info.resource,
            "file_sha256": files.file_sha256(path),
            "cleaning_version": embedded.CLEANING_VERSION,
        }
        notes = {"description": info.description, "license": info.license}
        return _source(data, described, lambda: embedded.iter_documents(name), notes=notes)
    if data.kind == SourceKind.files:
        paths = files.resolve_paths(list(data.paths))
        described = {
            "kind": "files",
            "files": files.files_fingerprint(paths),
            "text_field": data.text_field,
            "document_separator": data.document_separator,
        }
        return _source(
            data,
            described,
            lambda: files.iter_file_documents(paths, data.text_field, data.document_separator),
            known_count=len(paths) if data.document_separator is None else None,
        )
    described = {
        "kind": "hub",
        "hub_name": data.hub_name,
        "hub_config": data.hub_config,
        "hub_split": data.hub_split,
        # without a pinned revision the hub content may change under the same fingerprint
        "hub_revision": data.hub_revision or "unpinned",
        "text_field": data.text_field,
    }
    return _source(
        data,
        described,
        lambda: hub.iter_hub_documents(
            str(data.hub_name), data.hub_config, data.hub_split, data.hub_revision, data.text_field
        ),
    )


def _source(
    data: DataConfig,
    described: dict[str, Any],
    raw_documents: Callable[[], Iterator[str]],
    known_count: int | None = None,
    notes: dict[str, str] | None = None,
) -> Source:
    described["max_documents"] = data.max_documents
    canonical = json.dumps(described, sort_keys=True).encode()
    described["sha256"] = hashlib.sha256(canonical).hexdigest()
    described.update(notes or {})  # human-readable only: kept out of the hash
    return Source(described, raw_documents, data.max_documents, known_count)
