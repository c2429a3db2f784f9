"""Typed configuration of the data preparation stage.

Plain dataclasses (no Hydra here): `pipelines/` registers them in Hydra's ConfigStore, so
the YAML in `conf/data/` and `conf/tokenizer/` is type-checked at start-up, and tests can
build them directly. `DataConfig` and `TokenizerConfig` are shared with later stages
(pretrain reads the prepared data through the same two groups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from omegaconf import MISSING

from data_prep.errors import DataPrepError

SPLIT_NAMES = ("train", "validation", "test")


class SourceKind(StrEnum):
    embedded = "embedded"  # a corpus shipped inside an installed package (offline default)
    files = "files"  # local .txt / .jsonl / .parquet files (optionally .gz for txt/jsonl)
    hub = "hub"  # a Hugging Face dataset by name, streamed (needs network)


class TokenizerKind(StrEnum):
    gpt2 = "gpt2"  # exact GPT-2 BPE from the pinned offline asset (tiktoken)
    sentencepiece = "sentencepiece"  # a SentencePiece .model file (default: 32k Llama-style)
    hf = "hf"  # any Hugging Face `tokenizers` tokenizer by hub name (needs network)
    bytebpe = "bytebpe"  # byte-level BPE trained on the train split of the corpus


@dataclass
class DataConfig:
    name: str = MISSING
    kind: SourceKind = MISSING
    # kind=embedded: which packaged corpus (see data_prep.sources.embedded.EMBEDDED_CORPORA)
    embedded: str | None = None
    # kind=files: file paths or glob patterns, relative to the working directory
    paths: list[str] = field(default_factory=list)
    # kind=files (.jsonl/.parquet) and kind=hub: the field holding the document text
    text_field: str = "text"
    # kind=files (.txt): None = one document per file, else split each file on this string
    document_separator: str | None = None
    # kind=files: a data_prep.docs_corpus set ("base", "large") that writes paths[0] when it is
    # missing, from Debian's documentation packages (apt-get and a Debian mirror, no hub);
    # None: the files must exist
    build: str | None = None
    # kind=hub
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    hub_revision: str | None = None
    # kind=hub: its size as its publishers state it, for `make prefetch`'s listing (not read
    # by anything else; null: not recorded)
    hub_size: str | None = None
    # any kind: stop after this many non-empty documents (small slices for tests and trials)
    max_documents: int | None = None
    # train / validation / test fractions of documents, and the seed that places them
    split_ratios: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])
    split_seed: int = 1234


@dataclass
class TokenizerConfig:
    name: str = MISSING
    kind: TokenizerKind = MISSING
    # fixed tokenizers: the expected size (checked after loading); bytebpe: the target size
    vocab_size: int | None = None
    # gpt2: a .tiktoken file; sentencepiece: a .model file; None = the packaged default
    asset: str | None = None
    # kind=hf
    hf_name: str | None = None
    hf_revision: str | None = None
    # the end-of-document token; None = the tokenizer's own (eos / <|endoftext|>)
    eod_token: str | None = None
    # kind=bytebpe: train on at most this many train-split documents (None = all)
    train_max_documents: int | None = None


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # output goes to <output_root>/<data.name>__<tokenizer.name> unless output_dir is set
    output_root: str = "data"
    output_dir: str | None = None
    # worker processes for tokenization; 0 = one per CPU core
    num_proc: int = 0
    # replace an existing output that was built from different inputs
    overwrite: bool = False
    # the model's vocabulary size, checked against the tokenizer's padded size (None = skip)
    model_vocab_size: int | None = None
    make_vocab_size_divisible_by: int = 128
    tensor_model_parallel_size: int = 1
    progress: bool = True


def validate(cfg: PrepareConfig) -> None:
    """Check the cross-field rules that types alone cannot express, before any work."""
    validate_data(cfg.data)
    validate_tokenizer(cfg.tokenizer)
    if cfg.num_proc < 0:
        raise DataPrepError(f"num_proc={cfg.num_proc} is negative; use 0 (all cores) or more")
    if cfg.make_vocab_size_divisible_by < 1 or cfg.tensor_model_parallel_size < 1:
        raise DataPrepError(
            "make_vocab_size_divisible_by and tensor_model_parallel_size must be >= 1"
        )


def validate_data(data: DataConfig) -> None:
    where = f"data={data.name}"
    if data.kind == SourceKind.embedded and not data.embedded:
        raise DataPrepError(f"{where}: kind=embedded needs data.embedded=<corpus name>")
    if data.kind == SourceKind.files and not data.paths:
        raise DataPrepError(f"{where}: kind=files needs data.paths=[file or glob, ...]")
    if data.build is not None:
        from data_prep.docs_corpus import SETS

        if data.kind != SourceKind.files or len(data.paths) != 1:
            raise DataPrepError(f"{where}: data.build={data.build!r} needs kind=files and one "
                                "data.paths entry (the file it writes); or data.build=null")  # fmt: skip
        if data.build not in SETS:
            raise DataPrepError(f"{where}: data.build={data.build!r} is not a docs_corpus set; "
                                f"use one of {', '.join(sorted(SETS))}, or null")  # fmt: skip
    if data.kind == SourceKind.hub and not data.hub_name:
        raise DataPrepError(f"{where}: kind=hub needs data.hub_name=<org/dataset>")
    if data.max_documents is not None and data.max_documents < 1:
        raise DataPrepError(f"{where}: max_documents must be >= 1 (or null for all)")
    ratios = list(data.split_ratios)
    if (
        len(ratios) != len(SPLIT_NAMES)
        or any(r < 0 for r in ratios)
        or not math.isclose(sum(ratios), 1.0, abs_tol=1e-6)
    ):
        raise DataPrepError(
            f"{where}: split_ratios={ratios} must be 3 non-negative numbers "
            "(train, validation, test) summing to 1"
        )
    if ratios[0] == 0:
        raise DataPrepError(f"{where}: split_ratios gives the train split nothing")


def validate_tokenizer(tok: TokenizerConfig) -> None:
    where = f"tokenizer={tok.name}"
    if tok.kind == TokenizerKind.hf and not tok.hf_name:
        raise DataPrepError(f"{where}: kind=hf needs tokenizer.hf_name=<org/name>")
    if tok.kind == TokenizerKind.bytebpe and (tok.vocab_size is None or tok.vocab_size < 300):
        # 256 byte symbols + the EOD token is the floor; below ~300 there is nothing to merge
        raise DataPrepError(f"{where}: kind=bytebpe needs tokenizer.vocab_size >= 300")
