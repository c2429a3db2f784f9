"""The unigram level of prepared data: the entropy of its token frequencies, in nats/token.

A model that learned only how often each token occurs, and nothing of context, has a
cross-entropy near this entropy (on held-out text a little above it). A training run whose
validation loss ends near it has learned little beyond unigram statistics, so the studies
report it beside their losses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_prep.config import SPLIT_NAMES
from data_prep.dataset import read_metadata
from data_prep.errors import DataPrepError

__all__ = ["split_unigram_entropy", "unigram_entropy"]


def unigram_entropy(tokens: np.ndarray) -> float:
    """-sum p log p (nats) of the token frequencies of ``tokens`` (any integer array)."""
    counts = np.bincount(np.asarray(tokens).reshape(-1).astype(np.int64))
    counts = counts[counts > 0].astype(np.float64)
    if counts.size == 0:
        raise ValueError("unigram_entropy needs at least one token")
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def split_unigram_entropy(prepared: str | Path, split: str = "train") -> dict[str, float | int]:
    """The unigram entropy of one split of a prepared dataset (``data/<data>__<tokenizer>/``:
    ``<split>.bin`` holds the split's tokens back to back, in the metadata's dtype), with the
    token count it was computed over: ``{"nats": ..., "tokens": ...}``."""
    path = Path(prepared)
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
    metadata = read_metadata(path)
    if metadata is None:
        raise DataPrepError(f"no prepared data at {path}; run `python -m pipelines.prepare` first")
    tokens = np.fromfile(path / f"{split}.bin", dtype=np.dtype(metadata["dtype"]))
    expected = metadata.get("splits", {}).get(split, {}).get("tokens")
    if expected is not None and tokens.size != expected:
        raise DataPrepError(
            f"{path / split}.bin holds {tokens.size} tokens, the metadata {expected}; "
            "prepare the data again"
        )
    return {"nats": unigram_entropy(tokens), "tokens": int(tokens.size)}
