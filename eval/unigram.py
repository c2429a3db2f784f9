"""The unigram level of a prepared corpus: the loss a model reaches by learning token frequencies only.

A unigram model is fitted on the train split (token counts with add-one smoothing over the
tokenizer's vocabulary, so no validation token gets probability 0) and scored on every
token of the validation split: the mean of -ln p(token), in nats per token. A language model
whose validation loss is near this level has learned little beyond how often each token
occurs; the tables stage states it in the quality table's notes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from data_prep.dataset import PreparedData
from eval.splits import SplitReader

__all__ = ["UnigramLevel", "unigram_level"]


@dataclass(frozen=True)
class UnigramLevel:
    loss: float  # nats per token on `split`
    fit_split: str
    split: str
    vocab_size: int
    smoothing: float  # pseudo-count added to every entry (1.0: add-one / Laplace)
    fit_tokens: int
    tokens: int

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def unigram_level(
    prepared: PreparedData,
    *,
    fit_split: str = "train",
    split: str = "validation",
    smoothing: float = 1.0,
) -> UnigramLevel:
    """Cross entropy on `split` of the add-`smoothing` unigram model fitted on `fit_split`."""
    vocab = prepared.vocab_size
    fit = np.asarray(SplitReader.open(prepared, fit_split).tokens)
    scored = np.asarray(SplitReader.open(prepared, split).tokens)
    counts = np.bincount(fit, minlength=vocab).astype(np.float64)[:vocab]
    log_prob = np.log(counts + smoothing) - math.log(len(fit) + smoothing * vocab)
    loss = -float(np.mean(log_prob[scored])) if len(scored) else math.nan
    return UnigramLevel(loss, fit_split, split, vocab, smoothing, int(len(fit)), int(len(scored)))
