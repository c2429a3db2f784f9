"""The unigram level: add-one-smoothed train-split counts scored on the validation split."""

import math
from collections import Counter

from eval.splits import SplitReader
from eval.unigram import unigram_level


def test_unigram_level_by_hand(prepared):
    train = SplitReader.open(prepared, "train").tokens.tolist()
    valid = SplitReader.open(prepared, "validation").tokens.tolist()
    vocab = prepared.vocab_size
    counts = Counter(train)
    by_hand = -sum(math.log((counts[t] + 1) / (len(train) + vocab)) for t in valid) / len(valid)

    level = unigram_level(prepared)
    assert math.isclose(level.loss, by_hand, rel_tol=1e-9)
    assert (level.tokens, level.fit_tokens, level.vocab_size) == (len(valid), len(train), vocab)
    # below the uniform distribution's ln V, above the entropy of the validation split itself
    own = Counter(valid)
    entropy = -sum(c / len(valid) * math.log(c / len(valid)) for c in own.values())
    assert entropy < level.loss < math.log(vocab)


def test_smoothing_keeps_unseen_tokens_finite(prepared):
    level = unigram_level(prepared, fit_split="test", split="validation", smoothing=0.5)
    assert math.isfinite(level.loss) and level.smoothing == 0.5
