"""Reading prepared data back: the API later stages (pretrain, eval) use.

A prepared dataset is a directory `<root>/<data>__<tokenizer>/` holding
`{train,validation,test}.{bin,idx}` (Megatron-Core indexed datasets), `metadata.json`
and, for a trained tokenizer, `tokenizer.json`. `load_prepared` checks the files against
the metadata (sizes, index header, counts and sha256), so a truncated or corrupt file
is reported before a training run trips over it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.config import SPLIT_NAMES, TokenizerConfig, TokenizerKind
from data_prep.errors import DataPrepError
from data_prep.tokenizers import TextTokenizer, build_tokenizer

METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1

# Megatron-Core's .idx layout (indexed_dataset._IndexWriter): magic, version, dtype code,
# sequence count, document count, then int32 lengths, int64 pointers, int64 doc indices.
_IDX_MAGIC = b"MMIDIDX\x00\x00"
_IDX_HEADER = struct.Struct("<9sQBQQ")
_DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}


def prepared_dir(output_root: str | Path, data_name: str, tokenizer_name: str) -> Path:
    return Path(output_root) / f"{data_name}__{tokenizer_name}"


@dataclass
class PreparedData:
    path: Path
    metadata: dict[str, Any]

    def prefix(self, split: str) -> str:
        """The path prefix Megatron's datasets take (without .bin/.idx)."""
        return str(self.path / split)

    @property
    def vocab_size(self) -> int:
        return int(self.metadata["tokenizer"]["vocab_size"])

    def build_tokenizer(self) -> TextTokenizer:
        """The exact tokenizer the data was made with (hash-checked)."""
        recorded = self.metadata["tokenizer"]
        cfg = TokenizerConfig(**{**recorded["config"], "kind": TokenizerKind(recorded["kind"])})
        tokenizer = build_tokenizer(cfg, saved_file=self.path / TOKENIZER_FILE)
        if tokenizer.sha256 != recorded["sha256"]:
            raise DataPrepError(
                f"tokenizer {cfg.name!r} here (sha256 {tokenizer.sha256[:12]}...) is not the one "
                f"{self.path} was prepared with ({recorded['sha256'][:12]}...); prepare the data again"
            )
        return tokenizer


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The metadata of a prepared dataset, or None when `path` holds none."""
    meta_file = path / METADATA_FILE
    if not meta_file.is_file():
        return None
    try:
        metadata = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataPrepError(
            f"{meta_file} is unreadable ({err}); delete {path} and prepare the data again"
        ) from err
    if not isinstance(metadata, dict) or metadata.get("format_version") != FORMAT_VERSION:
        raise DataPrepError(
            f"{meta_file} is not format version {FORMAT_VERSION}; delete {path} and prepare again"
        )
    return metadata


def load_prepared(path: str | Path, verify_hashes: bool = True) -> PreparedData:
    """Open prepared data, checking every split file against the metadata."""
    path = Path(path)
    metadata = read_metadata(path)
    if metadata is None:
        raise DataPrepError(
            f"no prepared data at {path} ({METADATA_FILE} missing); run "
            "`python -m pipelines.prepare data=<name> tokenizer=<name>` first"
        )
    for split in SPLIT_NAMES:
        problem = split_problem(path, split, metadata, verify_hashes)
        if problem:
            raise DataPrepError(
                f"prepared data {path} is corrupt: {problem}; delete {path} and run the prepare "
                "stage again (or rerun it with overwrite=true)"
            )
    return PreparedData(path, metadata)


def check_prepared(path: str | Path, tokenizer: TextTokenizer) -> PreparedData:
    """Prepared data that exists, is intact, and was made with exactly `tokenizer`."""
    prepared = load_prepared(path, verify_hashes=False)
    recorded = prepared.metadata["tokenizer"]["sha256"]
    if tokenizer.sha256 != recorded:
        raise DataPrepError(
            f"{path} was prepared with a different tokenizer (sha256 {recorded[:12]}... vs "
            f"{tokenizer.sha256[:12]}... for {tokenizer.name!r}); prepare it with this tokenizer"
        )
    return prepared


def split_problem(path: Path, split: str, metadata: dict[str, Any], verify_hashes: bool) -> str:
    """What is wrong with one split's files (empty string when nothing is)."""
    info = metadata["splits"][split]
    bin_path, idx_path = path / f"{split}.bin", path / f"{split}.idx"
    for file in (bin_path, idx_path):
        if not file.is_file():
            return f"{file.name} is missing"
    idx_bytes = idx_path.stat().st_size
    if idx_bytes < _IDX_HEADER.size:
        return f"{idx_path.name} is truncated ({idx_bytes} bytes)"
    with open(idx_path, "rb") as stream:
        magic, version, code, sequences, documents = _IDX_HEADER.unpack(
            stream.read(_IDX_HEADER.size)
        )
    if magic != _IDX_MAGIC or version != 1 or code != _DTYPE_CODES.get(metadata["dtype"]):
        return f"{idx_path.name} has a bad header"
    if sequences != info["documents"] or documents != info["documents"] + 1:
        return f"{idx_path.name} counts {sequences} documents, metadata says {info['documents']}"
    expected_idx = _IDX_HEADER.size + sequences * (4 + 8) + documents * 8
    if idx_bytes != expected_idx:
        return f"{idx_path.name} is {idx_bytes} bytes, expected {expected_idx} (truncated?)"
    lengths = np.fromfile(idx_path, dtype=np.int32, count=sequences, offset=_IDX_HEADER.size)
    itemsize = np.dtype(metadata["dtype"]).itemsize
    if int(lengths.sum()) != info["tokens"] or bin_path.stat().st_size != info["tokens"] * itemsize:
        return (
            f"{bin_path.name} does not hold the {info['tokens']} tokens the index and metadata say"
        )
    if verify_hashes:
        for file, key in ((bin_path, "bin_sha256"), (idx_path, "idx_sha256")):
            if sha256_file(file) != info[key]:
                return f"{file.name} content differs from its recorded sha256"
    return ""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
