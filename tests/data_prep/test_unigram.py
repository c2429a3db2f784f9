"""The unigram level: the entropy of a split's token frequencies, from the prepared files."""

import json
import math

import numpy as np
import pytest

from data_prep.errors import DataPrepError
from data_prep.unigram import split_unigram_entropy, unigram_entropy


def test_entropy_of_known_distributions():
    assert unigram_entropy(np.array([3, 3, 3])) == 0.0
    assert unigram_entropy(np.array([0, 1, 0, 1])) == pytest.approx(math.log(2))
    assert unigram_entropy(np.arange(8, dtype=np.uint16)) == pytest.approx(math.log(8))
    # p = (1/2, 1/4, 1/4): H = 1.5 ln 2; ids need not be contiguous
    assert unigram_entropy(np.array([7, 7, 1000, 2])) == pytest.approx(1.5 * math.log(2))
    with pytest.raises(ValueError):
        unigram_entropy(np.array([], dtype=np.int64))


def _toy_prepared(tmp_path, tokens, dtype="uint16", recorded=None):
    (tmp_path / "train.bin").write_bytes(np.asarray(tokens, dtype=dtype).tobytes())
    meta = {"format_version": 1, "dtype": dtype,
            "splits": {"train": {"tokens": len(tokens) if recorded is None else recorded}}}  # fmt: skip
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    return tmp_path


def test_split_entropy_reads_the_bin_in_the_metadata_dtype(tmp_path):
    # 1000 as uint16 is two bytes; read as uint8 it would be two other tokens
    got = split_unigram_entropy(_toy_prepared(tmp_path, [1000, 1000, 5, 6]))
    assert got == {"nats": pytest.approx(1.5 * math.log(2)), "tokens": 4}


def test_a_split_whose_size_disagrees_with_the_metadata_is_refused(tmp_path):
    with pytest.raises(DataPrepError, match="prepare the data again"):
        split_unigram_entropy(_toy_prepared(tmp_path, [1, 2, 3], recorded=4))
    with pytest.raises(DataPrepError, match="no prepared data"):
        split_unigram_entropy(tmp_path / "missing")


def test_prepared_corpus_entropy_is_over_every_train_token(prepared_slice):
    got = split_unigram_entropy(prepared_slice.path)
    meta = prepared_slice.metadata
    assert got["tokens"] == meta["splits"]["train"]["tokens"]
    assert 0.0 < got["nats"] < math.log(meta["tokenizer"]["vocab_size"])
