"""Tokenize documents in worker processes and write Megatron indexed datasets.

Documents stay in source order whatever `num_proc` is (results are collected in
submission order), so the output is byte-identical for any number of workers. At most
`2 * num_proc` chunks are in flight, which keeps memory flat on a streamed corpus
(`Pool.imap` would read the whole input ahead). Each document is written as one
sequence ending with the EOD id, as Megatron's `preprocess_data.py --append-eod` does.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.config import SPLIT_NAMES
from data_prep.progress import Progress
from data_prep.tokenizers import TextTokenizer

_CHUNK_DOCS = 16  # documents per task: big enough to hide the IPC cost, small enough to balance


@dataclass
class SplitCounts:
    documents: int = 0
    tokens: int = 0  # including one EOD per document


@dataclass
class WriteReport:
    splits: dict[str, SplitCounts] = field(default_factory=dict)
    dtype: str = ""
    seconds: float = 0.0  # the whole pass: read, tokenize, write
    # CPU seconds inside tokenize(), summed over workers: a rate that the machine's load
    # does not distort, unlike the wall-clock `seconds`
    tokenizer_cpu_seconds: float = 0.0
    num_proc: int = 1

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.splits.values())

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.splits.values())


def import_megatron_indexed_dataset() -> Any:
    """megatron.core costs ~5-9 s to import; do it only when data is really written or read."""
    # its import announces missing Transformer Engine/Apex and Megatron-FSDP at INFO/WARN
    # level; none of that matters for writing token files, so keep the stage's output clean
    fsdp_logger = logging.getLogger("megatron.core.distributed.fsdp")
    level = fsdp_logger.level
    fsdp_logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="Transformer Engine and Apex are not installed"
            )
            from megatron.core.datasets import indexed_dataset
    finally:
        fsdp_logger.setLevel(level)
    return indexed_dataset


def write_splits(
    documents: Iterable[str],
    split_of: Iterator[int],
    tokenizer: TextTokenizer,
    out_dir: Path,
    num_proc: int,
    progress: bool = False,
    expected_documents: int | None = None,
) -> WriteReport:
    """Write `<out_dir>/{train,validation,test}.{bin,idx}`; `split_of` yields 0/1/2 per document."""
    indexed_dataset = import_megatron_indexed_dataset()

    dtype = indexed_dataset.DType.optimal_dtype(tokenizer.vocab_size)
    builders = {
        name: indexed_dataset.IndexedDatasetBuilder(str(out_dir / f"{name}.bin"), dtype=dtype)
        for name in SPLIT_NAMES
    }
    report = WriteReport(splits={name: SplitCounts() for name in SPLIT_NAMES}, dtype=dtype.__name__)
    report.num_proc = num_proc = num_proc or os.cpu_count() or 1
    bar = Progress(expected_documents, "prepare", unit="doc", enabled=progress)
    start = time.perf_counter()
    try:
        for texts, (ids, lengths, seconds) in _encode_in_order(documents, tokenizer, num_proc):
            report.tokenizer_cpu_seconds += seconds
            for doc_ids in np.split(ids, np.cumsum(lengths)[:-1]):
                name = SPLIT_NAMES[next(split_of)]
                document = np.append(doc_ids, tokenizer.eod)
                builders[name].add_document(document, [document.size])
                counts = report.splits[name]
                counts.documents += 1
                counts.tokens += int(document.size)
            bar.update(len(texts))
        for name, builder in builders.items():
            builder.finalize(str(out_dir / f"{name}.idx"))
    finally:
        bar.close()
        for builder in builders.values():
            builder.data_file.close()  # a no-op after finalize; on error, releases the file
    report.seconds = time.perf_counter() - start
    return report


# --- workers ---------------------------------------------------------------------------

_worker_tokenizer: TextTokenizer | None = None


def _init_worker(tokenizer: TextTokenizer, in_pool: bool = True) -> None:
    global _worker_tokenizer
    if in_pool:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _worker_tokenizer = tokenizer


def _encode_chunk(texts: list[str]) -> tuple[np.ndarray, np.ndarray, float]:
    """All ids of a chunk concatenated plus per-document lengths: one array pair to pickle."""
    assert _worker_tokenizer is not None, "worker not initialised"
    start = time.thread_time()
    encoded = [_worker_tokenizer.tokenize(text) for text in texts]
    seconds = time.thread_time() - start
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
    ids = np.fromiter((i for e in encoded for i in e), dtype=np.int64, count=int(lengths.sum()))
    return ids, lengths, seconds


def _chunks(documents: Iterable[str]) -> Iterator[list[str]]:
    iterator = iter(documents)
    while chunk := list(islice(iterator, _CHUNK_DOCS)):
        yield chunk


def _encode_in_order(
    documents: Iterable[str], tokenizer: TextTokenizer, num_proc: int
) -> Iterator[tuple[list[str], tuple[np.ndarray, np.ndarray, float]]]:
    if num_proc == 1:
        _init_worker(tokenizer, in_pool=False)
        for texts in _chunks(documents):
            yield texts, _encode_chunk(texts)
        return
    # forkserver, not fork: a forked child inherits the parent's threads' locks (torch, tqdm,
    # tokenizers) and can hang for good; the forkserver forks from a clean, single-threaded server
    with multiprocessing.get_context("forkserver").Pool(
        num_proc, initializer=_init_worker, initargs=(tokenizer,)
    ) as pool:
        pending: deque[tuple[list[str], Any]] = deque()
        for texts in _chunks(documents):
            pending.append((texts, pool.apply_async(_encode_chunk, (texts,))))
            if len(pending) >= 2 * num_proc:
                done_texts, result = pending.popleft()
                yield done_texts, result.get()
        while pending:
            done_texts, result = pending.popleft()
            yield done_texts, result.get()
