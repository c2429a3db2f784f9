"""The data preparation stage: corpus -> tokenizer -> Megatron indexed train/validation/test.

Idempotent: the inputs (source content, split ratios and seed, tokenizer identity, output
format) are hashed into a fingerprint before any work; when the output directory already
holds intact data with that fingerprint, nothing is redone. Atomic: everything is written
into a hidden sibling directory that is renamed onto the final name only when complete,
so a killed run never leaves a half-written dataset under the final name; leftovers of
killed runs are removed by the next run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from itertools import islice
from pathlib import Path
from typing import Any

from data_prep import assets, dataset
from data_prep.config import (
    SPLIT_NAMES,
    DataConfig,
    PrepareConfig,
    TokenizerConfig,
    TokenizerKind,
    validate,
)
from data_prep.errors import DataPrepError
from data_prep.sources import Source, open_source
from data_prep.splits import assign_splits
from data_prep.tokenizers import (
    HFTokenizer,
    TextTokenizer,
    build_tokenizer,
    check_model_vocab,
    padded_vocab_size,
    train_bytebpe,
)
from data_prep.writer import WriteReport, write_splits


@dataclass
class PrepareResult:
    path: Path
    metadata: dict[str, Any]
    skipped: bool  # True when intact data with the same fingerprint was already there
    report: WriteReport | None = None

    def summary(self) -> str:
        meta = self.metadata
        lines = [
            f"{'already prepared, nothing redone' if self.skipped else 'prepared'}: {self.path} "
            f"(fingerprint {meta['fingerprint'][:16]}, tokenizer {meta['tokenizer']['name']} "
            f"vocab {meta['tokenizer']['vocab_size']})"
        ]
        source = meta["data"]["source"]
        if "license" in source:  # prepared data inherits the corpus licence: say so
            lines.append(f"  source: {source['description']}; licence: {source['license']}")
        for name in SPLIT_NAMES:
            split = meta["splits"][name]
            lines.append(
                f"  {name:<10} {split['documents']:>9,} documents {split['tokens']:>13,} tokens"
            )
        if self.report is not None:
            rep = self.report
            lines.append(
                f"  throughput: {rep.tokens / rep.seconds:,.0f} tokens/s end to end (read, tokenize, "
                f"write; num_proc={rep.num_proc}, {rep.seconds:.2f} s wall); tokenize() alone "
                f"{rep.tokens / max(rep.tokenizer_cpu_seconds, 1e-9):,.0f} tokens per CPU-second"
            )
        return "\n".join(lines)


def output_path(cfg: PrepareConfig) -> Path:
    if cfg.output_dir:
        return Path(cfg.output_dir)
    return dataset.prepared_dir(cfg.output_root, cfg.data.name, cfg.tokenizer.name)


def prepare(cfg: PrepareConfig, command: str | None = None) -> PrepareResult:
    validate(cfg)
    vocab_check = (
        cfg.model_vocab_size,
        cfg.make_vocab_size_divisible_by,
        cfg.tensor_model_parallel_size,
    )
    if cfg.tokenizer.vocab_size is not None:  # fail before reading anything when we can
        check_model_vocab(cfg.tokenizer.name, cfg.tokenizer.vocab_size, *vocab_check)
    out = output_path(cfg)
    build_missing(cfg.data)
    source = open_source(cfg.data)
    fingerprint = _fingerprint(cfg, source)

    existing = dataset.read_metadata(out)
    if existing is not None and existing["fingerprint"] == fingerprint:
        prepared = dataset.load_prepared(out)  # raises, touching nothing, if corrupt
        check_model_vocab(cfg.tokenizer.name, prepared.vocab_size, *vocab_check)
        return PrepareResult(out, prepared.metadata, skipped=True)
    if existing is not None and not cfg.overwrite:
        raise DataPrepError(
            f"{out} holds data prepared from different inputs (fingerprint "
            f"{existing['fingerprint'][:12]}... vs {fingerprint[:12]}...); pass overwrite=true "
            "to replace it, or output_dir=<elsewhere>"
        )
    if existing is None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataPrepError(
            f"{out} exists but is not prepared data (no {dataset.METADATA_FILE}); "
            "move it away or pass output_dir=<elsewhere>"
        )

    _require_documents(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        started = time.perf_counter()
        tokenizer = _obtain_tokenizer(cfg, source, tmp)
        check_model_vocab(cfg.tokenizer.name, tokenizer.vocab_size, *vocab_check)
        report = write_splits(
            source.documents(),
            assign_splits(list(cfg.data.split_ratios), cfg.data.split_seed),
            tokenizer,
            tmp,
            cfg.num_proc,
            cfg.progress,
            source.expected_count,
        )
        _check_splits(cfg, report)
        metadata = _metadata(cfg, source, fingerprint, tokenizer, report, tmp, command)
        metadata["created"]["seconds"] = round(time.perf_counter() - started, 3)
        (tmp / dataset.METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        _publish(tmp, out, fingerprint)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PrepareResult(out, metadata, skipped=False, report=report)


def build_missing(data: DataConfig) -> bool:
    """Write a ``data.build`` corpus's file when it is missing (:mod:`data_prep.docs_corpus`,
    ~2 minutes from a Debian mirror); True when it built one."""
    if data.build is None or Path(data.paths[0]).exists():
        return False
    from data_prep.docs_corpus import build_set

    print(f"{data.paths[0]}: not built yet; building docs_corpus set {data.build!r} from "
          "Debian's documentation packages (apt-get; ~2 min)", flush=True)  # fmt: skip
    build_set(data.build, Path(data.paths[0]))
    return True


def _fingerprint(cfg: PrepareConfig, source: Source) -> str:
    inputs = {
        "format_version": dataset.FORMAT_VERSION,
        "source_sha256": source.sha256,
        "split_ratios": list(cfg.data.split_ratios),
        "split_seed": cfg.data.split_seed,
        "tokenizer": _tokenizer_identity(cfg.tokenizer),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _tokenizer_identity(tok: TokenizerConfig) -> dict[str, Any]:
    """What determines the token ids, known without a network or training."""
    identity: dict[str, Any] = {"kind": tok.kind.value}
    if tok.kind == TokenizerKind.gpt2:
        identity["sha256"] = assets.sha256_of(assets.gpt2_asset(tok.asset))  # also checks it
    elif tok.kind == TokenizerKind.sentencepiece:
        model = Path(tok.asset) if tok.asset else assets.llama_sp_asset()
        if not model.is_file():
            raise DataPrepError(f"SentencePiece model {model} not found; fix tokenizer.asset")
        identity["sha256"] = assets.sha256_of(model)
    elif tok.kind == TokenizerKind.hf:
        identity.update(name=tok.hf_name, revision=tok.hf_revision, eod_token=tok.eod_token)
    else:
        identity.update(
            vocab_size=tok.vocab_size,
            train_max_documents=tok.train_max_documents,
            # the trainer's output could change between library versions
            tokenizers_version=version("tokenizers"),
        )
    return identity


def _obtain_tokenizer(cfg: PrepareConfig, source: Source, tmp: Path) -> TextTokenizer:
    if cfg.tokenizer.kind == TokenizerKind.bytebpe:
        train_docs = islice(_train_documents(cfg, source), cfg.tokenizer.train_max_documents)
        tokenizer: TextTokenizer = train_bytebpe(
            cfg.tokenizer.name, train_docs, int(cfg.tokenizer.vocab_size)
        )
    else:
        tokenizer = build_tokenizer(cfg.tokenizer)
    if isinstance(tokenizer, HFTokenizer):
        # trained or downloaded: saved beside the data so later stages reload it offline
        tokenizer.save(tmp / dataset.TOKENIZER_FILE)
    return tokenizer


def _train_documents(cfg: PrepareConfig, source: Source) -> Iterator[str]:
    """The train split only: the tokenizer must not see validation or test text."""
    splits = assign_splits(list(cfg.data.split_ratios), cfg.data.split_seed)
    return (doc for doc in source.documents() if next(splits) == 0)


def _require_documents(source: Source) -> None:
    if next(source.documents(), None) is None:
        raise DataPrepError(
            f"the corpus ({source.fingerprint['kind']} source) has no non-empty documents; "
            "check data.paths / data.text_field, or the hub dataset name and split"
        )


def _check_splits(cfg: PrepareConfig, report: WriteReport) -> None:
    for name, ratio in zip(SPLIT_NAMES, cfg.data.split_ratios, strict=True):
        if ratio > 0 and report.splits[name].documents == 0:
            raise DataPrepError(
                f"split {name!r} got no documents ({report.documents} in all, ratios "
                f"{list(cfg.data.split_ratios)}); use more documents or a larger {name} ratio"
            )


def _metadata(
    cfg: PrepareConfig,
    source: Source,
    fingerprint: str,
    tokenizer: TextTokenizer,
    report: WriteReport,
    tmp: Path,
    command: str | None,
) -> dict[str, Any]:
    tok_cfg = _plain(asdict(cfg.tokenizer))
    splits = {
        name: {
            "documents": counts.documents,
            "tokens": counts.tokens,
            "bin_sha256": dataset.sha256_file(tmp / f"{name}.bin"),
            "idx_sha256": dataset.sha256_file(tmp / f"{name}.idx"),
        }
        for name, counts in report.splits.items()
    }
    packages = ("megatron-core", "tokenizers", "tiktoken", "sentencepiece", "numpy", "gensim")
    return {
        "format_version": dataset.FORMAT_VERSION,
        "fingerprint": fingerprint,
        "data": {"name": cfg.data.name, "source": source.fingerprint},
        "tokenizer": {
            "name": tokenizer.name,
            "kind": cfg.tokenizer.kind.value,
            "vocab_size": tokenizer.vocab_size,
            "padded_vocab_size": padded_vocab_size(
                tokenizer.vocab_size,
                cfg.make_vocab_size_divisible_by,
                cfg.tensor_model_parallel_size,
            ),
            "eod": tokenizer.eod,
            "sha256": tokenizer.sha256,
            "file": dataset.TOKENIZER_FILE if isinstance(tokenizer, HFTokenizer) else None,
            "config": tok_cfg,
        },
        "dtype": report.dtype,
        "split_ratios": dict(zip(SPLIT_NAMES, cfg.data.split_ratios, strict=True)),
        "split_seed": cfg.data.split_seed,
        "splits": splits,
        "created": {
            "command": command or "data_prep.prepare.prepare(cfg) (Python API)",
            "config": _plain(asdict(cfg)),
            "utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": sys.version.split()[0],
            "packages": {name: version(name) for name in packages},
            "num_proc": report.num_proc,
            "tokens_per_second": round(report.tokens / report.seconds),
            "tokens_per_cpu_second_in_tokenizer": round(
                report.tokens / max(report.tokenizer_cpu_seconds, 1e-9)
            ),
        },
    }


def _plain(value: Any) -> Any:
    """Enums to their values so the config is JSON and reloadable."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return getattr(value, "value", value)


def _remove_leftovers(out: Path) -> None:
    """Temporary directories of runs that were killed (their process no longer exists)."""
    for leftover in out.parent.glob(f".{out.name}.*-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _publish(tmp: Path, out: Path, fingerprint: str) -> None:
    """Rename the finished directory onto the final name (replacing an older one last)."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        tmp.rename(out)
    except OSError:
        # a concurrent run published first: fine if it made the same data
        theirs = dataset.read_metadata(out)
        if theirs is None or theirs["fingerprint"] != fingerprint:
            raise
