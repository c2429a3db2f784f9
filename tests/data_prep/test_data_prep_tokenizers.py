"""Tokenizers: published GPT-2 ids, exact round trips, Megatron's vocabulary padding."""

from __future__ import annotations

import pickle
from itertools import islice

import pytest

from data_prep import assets
from data_prep.config import TokenizerConfig, TokenizerKind
from data_prep.errors import DataPrepError
from data_prep.sources import embedded, hub
from data_prep.tokenizers import (
    ENDOFTEXT,
    build_tokenizer,
    check_model_vocab,
    padded_vocab_size,
    train_bytebpe,
)

# Real articles plus strings that break careless tokenizers: unicode, CRLF, runs of
# spaces, and the EOD marker written as plain text.
TRICKY = [
    "naïve café — 日本語 😀 Ελληνικά\r\n\ttab  two  spaces   ",
    f"text mentioning {ENDOFTEXT} literally",
    " leading space and trailing newline\n",
]


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return list(islice(embedded.iter_documents("enwiki_sample"), 6)) + TRICKY


@pytest.fixture(scope="module")
def gpt2() -> object:
    return build_tokenizer(TokenizerConfig(name="gpt2", kind=TokenizerKind.gpt2, vocab_size=50257))


def test_gpt2_ids_equal_published_values(gpt2) -> None:
    # Published: Hugging Face GPT2Tokenizer docs ("Hello world", " Hello world") and
    # tiktoken's own test suite ("hello world"; digit merges "0", "00", "000").
    assert gpt2.tokenize("Hello world") == [15496, 995]
    assert gpt2.tokenize(" Hello world") == [18435, 995]
    assert gpt2.tokenize("hello world") == [31373, 995]
    assert [gpt2.tokenize(z) for z in ("0", "00", "000")] == [[15], [405], [830]]
    assert (gpt2.vocab_size, gpt2.eod) == (50257, 50256)
    assert gpt2.sha256 == assets.GPT2_SHA256


def test_byte_level_round_trip_is_exact(gpt2, documents) -> None:
    train_docs = list(islice(embedded.iter_documents("enwiki_sample"), 4))
    bpe = train_bytebpe("bpe", train_docs, 400)
    for tok in (gpt2, bpe):
        for doc in documents:
            ids = tok.tokenize(doc)
            assert tok.eod not in ids, "text must never turn into the EOD id"
            assert tok.detokenize(ids) == doc


def test_trained_bpe_is_deterministic_and_survives_pickling(documents) -> None:
    first = train_bytebpe("bpe", documents, 400)
    second = train_bytebpe("bpe", documents, 400)
    assert first.sha256 == second.sha256
    clone = pickle.loads(pickle.dumps(first))  # how worker processes receive it
    assert clone.tokenize(TRICKY[1]) == first.tokenize(TRICKY[1])
    assert (clone.vocab_size, clone.eod) == (400, 0)


def test_saved_tokenizer_json_reloads_offline(documents, tmp_path) -> None:
    """Trained and hub tokenizers are saved beside the data; later stages reload that file."""
    trained = train_bytebpe("bpe", documents, 400)
    trained.save(tmp_path / "tokenizer.json")
    for kind in (TokenizerKind.bytebpe, TokenizerKind.hf):
        cfg = TokenizerConfig(name="bpe", kind=kind, hf_name="someone/offline", eod_token=ENDOFTEXT)
        reloaded = build_tokenizer(cfg, saved_file=tmp_path / "tokenizer.json")
        assert (reloaded.sha256, reloaded.eod) == (trained.sha256, trained.eod)
    with pytest.raises(DataPrepError, match="run `python -m pipelines.prepare`"):
        build_tokenizer(
            TokenizerConfig(name="bpe", kind=TokenizerKind.bytebpe),
            saved_file=tmp_path / "absent.json",
        )


def test_bytebpe_too_large_for_corpus_is_an_error() -> None:
    with pytest.raises(DataPrepError, match="reached only"):
        train_bytebpe("bpe", ["tiny corpus"], 5000)


def test_llama_style_sentencepiece() -> None:
    tok = build_tokenizer(
        TokenizerConfig(name="llama_sp32k", kind=TokenizerKind.sentencepiece, vocab_size=32000)
    )
    assert (tok.vocab_size, tok.eod) == (32000, 2)
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.detokenize(tok.tokenize(text)) == text


def test_declared_vocab_size_is_checked() -> None:
    cfg = TokenizerConfig(name="gpt2", kind=TokenizerKind.gpt2, vocab_size=50304)
    with pytest.raises(DataPrepError, match="50257 entries"):
        build_tokenizer(cfg)


@pytest.mark.parametrize(
    ("vocab", "divisible_by", "tp", "padded"),
    [
        (50257, 128, 1, 50304),
        (50257, 128, 2, 50432),
        (32000, 128, 1, 32000),
        (4096, 128, 8, 4096),
        (1, 128, 1, 128),
    ],
)
def test_padded_vocab_size_matches_megatron(vocab, divisible_by, tp, padded) -> None:
    assert padded_vocab_size(vocab, divisible_by, tp) == padded


def test_model_vocab_mismatch_names_the_padded_size() -> None:
    check_model_vocab("gpt2", 50257, 50304)
    check_model_vocab("gpt2", 50257, None)
    with pytest.raises(DataPrepError, match="set the model's vocab_size to 50304"):
        check_model_vocab("gpt2", 50257, 50257)


def test_missing_gpt2_asset_names_the_fix(tmp_path) -> None:
    with pytest.raises(DataPrepError, match="make setup"):
        assets.gpt2_asset(str(tmp_path / "gpt2.tiktoken"))
    wrong = tmp_path / "wrong.tiktoken"
    wrong.write_text("IQ== 0\n")
    with pytest.raises(DataPrepError, match="sha256"):
        assets.gpt2_asset(str(wrong))


def test_hub_tokenizer_offline_fails_fast(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=5.0: False)
    cfg = TokenizerConfig(name="hf", kind=TokenizerKind.hf, hf_name="EleutherAI/gpt-neox-20b")
    with pytest.raises(DataPrepError, match="unreachable"):
        build_tokenizer(cfg)
