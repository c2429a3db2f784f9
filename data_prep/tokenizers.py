"""Tokenizers behind one duck-typed interface that Megatron's GPTDataset accepts.

Every tokenizer here has `name`, `vocab_size`, `eod`, `sha256`, `tokenize(text) -> ids`,
`detokenize(ids) -> text` and the `unique_identifiers` Megatron's dataset cache uses. `tokenize` never turns text into special tokens: a
document that happens to contain "<|endoftext|>" stays text, so the only EOD ids in the
data are the document separators this stage writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from data_prep import assets
from data_prep.config import TokenizerConfig, TokenizerKind
from data_prep.errors import DataPrepError

ENDOFTEXT = "<|endoftext|>"
# eod candidates tried in order when a hub tokenizer does not say which it uses
_EOD_CANDIDATES = (ENDOFTEXT, "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")


class TextTokenizer(Protocol):
    name: str
    vocab_size: int
    eod: int
    sha256: str

    @property
    def unique_identifiers(self) -> dict[str, str]: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, ids: Iterable[int]) -> str: ...


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tp: int = 1) -> int:
    """The embedding size Megatron uses: rounded up to a multiple of divisible_by * tp."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def check_model_vocab(
    tokenizer_name: str,
    tokenizer_vocab_size: int,
    model_vocab_size: int | None,
    divisible_by: int = 128,
    tp: int = 1,
) -> None:
    """A model whose embedding is not the tokenizer's padded size cannot use this data."""
    if model_vocab_size is None:
        return
    padded = padded_vocab_size(tokenizer_vocab_size, divisible_by, tp)
    if model_vocab_size != padded:
        raise DataPrepError(
            f"model vocab_size {model_vocab_size} does not match tokenizer {tokenizer_name!r}: "
            f"{tokenizer_vocab_size} entries, padded to {padded} (multiple of {divisible_by} x tp {tp}); "
            f"set the model's vocab_size to {padded} or choose the tokenizer it was built for"
        )


class _MegatronIdentity:
    """Megatron's datasets hash `tokenizer.unique_identifiers` into their cache keys."""

    name: str
    sha256: str

    @property
    def unique_identifiers(self) -> dict[str, str]:
        return {"class": type(self).__qualname__, "name": self.name, "sha256": self.sha256}


class TiktokenGPT2(_MegatronIdentity):
    """Exact GPT-2 BPE (r50k_base merges from the pinned offline asset)."""

    def __init__(self, name: str, asset: Path) -> None:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext.openai_public import r50k_pat_str

        self._enc = tiktoken.Encoding(
            name="gpt2",
            pat_str=r50k_pat_str,
            mergeable_ranks=load_tiktoken_bpe(str(asset)),
            special_tokens={ENDOFTEXT: 50256},
        )
        self.name = name
        self.vocab_size = self._enc.n_vocab
        self.eod = self._enc.eot_token
        self.sha256 = assets.sha256_of(asset)

    def tokenize(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))


class SentencePiece(_MegatronIdentity):
    def __init__(self, name: str, model_file: Path) -> None:
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.name = name
        self.vocab_size = self._sp.vocab_size()
        self.eod = self._sp.eos_id()
        self.sha256 = assets.sha256_of(model_file)

    def tokenize(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._sp.decode(list(ids))


class HFTokenizer(_MegatronIdentity):
    """A Hugging Face `tokenizers` tokenizer (hub download or trained byte-level BPE)."""

    def __init__(self, name: str, tokenizer_json: str, eod_token: str | None = None) -> None:
        from tokenizers import Tokenizer

        self._json = tokenizer_json
        self._tok = Tokenizer.from_str(tokenizer_json)
        # special tokens inside document text stay text (see the module docstring)
        self._tok.encode_special_tokens = True
        self.name = name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod_token, self.eod = self._find_eod(eod_token)
        self.sha256 = hashlib.sha256(tokenizer_json.encode()).hexdigest()

    def _find_eod(self, eod_token: str | None) -> tuple[str, int]:
        for token in (eod_token,) if eod_token else _EOD_CANDIDATES:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token, token_id
        raise DataPrepError(
            f"tokenizer {self.name!r} has no end-of-document token "
            f"{eod_token or ' / '.join(_EOD_CANDIDATES)}; set tokenizer.eod_token"
        )

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def save(self, path: Path) -> None:
        path.write_text(self._json, encoding="utf-8")

    # the Rust object pickles without the encode_special_tokens flag: rebuild from JSON
    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "json": self._json, "eod_token": self.eod_token}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["json"], state["eod_token"])  # type: ignore[misc]


def build_tokenizer(cfg: TokenizerConfig, saved_file: Path | None = None) -> TextTokenizer:
    """Load the tokenizer `cfg` names.

    `saved_file` is the tokenizer.json the prepare stage leaves beside the data for
    trained (bytebpe) and hub (hf) tokenizers: read from it, neither needs training or a
    network again.
    """
    if cfg.kind == TokenizerKind.gpt2:
        tok: TextTokenizer = TiktokenGPT2(cfg.name, assets.gpt2_asset(cfg.asset))
    elif cfg.kind == TokenizerKind.sentencepiece:
        model = Path(cfg.asset) if cfg.asset else assets.llama_sp_asset()
        if not model.is_file():
            raise DataPrepError(f"SentencePiece model {model} not found; fix tokenizer.asset")
        tok = SentencePiece(cfg.name, model)
    elif saved_file is not None and saved_file.is_file():
        eod_token = ENDOFTEXT if cfg.kind == TokenizerKind.bytebpe else cfg.eod_token
        tok = HFTokenizer(cfg.name, saved_file.read_text(encoding="utf-8"), eod_token)
    elif cfg.kind == TokenizerKind.hf:
        tok = _from_hub(cfg)
    else:
        raise DataPrepError(
            f"trained tokenizer {cfg.name!r} not found at {saved_file}; "
            "run `python -m pipelines.prepare` for this data and tokenizer first"
        )
    if cfg.vocab_size is not None and tok.vocab_size != cfg.vocab_size:
        raise DataPrepError(
            f"tokenizer={cfg.name} has {tok.vocab_size} entries but tokenizer.vocab_size says "
            f"{cfg.vocab_size}; fix tokenizer.vocab_size or the tokenizer asset"
        )
    return tok


def _from_hub(cfg: TokenizerConfig) -> HFTokenizer:
    from tokenizers import Tokenizer

    from data_prep.sources.hub import require_hub

    require_hub(f"tokenizer {cfg.hf_name!r}")
    try:
        hub_tok = Tokenizer.from_pretrained(str(cfg.hf_name), revision=cfg.hf_revision or "main")
    except Exception as err:  # the Rust side raises plain Exception for HTTP and parse errors
        raise DataPrepError(
            f"could not load tokenizer {cfg.hf_name!r} from the hub ({err}); check the name "
            "and that the repo has a tokenizer.json (transformers-only tokenizers are not supported)"
        ) from err
    return HFTokenizer(cfg.name, hub_tok.to_str(), cfg.eod_token)


def train_bytebpe(name: str, documents: Iterable[str], vocab_size: int) -> HFTokenizer:
    """Train a GPT-2-style byte-level BPE; EOD is id 0 and decode(encode(x)) == x for any x."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # no normalizer and no prefix space: that is what makes the round trip exact
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer)
    trained = HFTokenizer(name, tok.to_str(), ENDOFTEXT)
    if trained.vocab_size != vocab_size:
        raise DataPrepError(
            f"byte-level BPE reached only {trained.vocab_size} of {vocab_size} entries: the training "
            "text is too small; lower tokenizer.vocab_size or use more documents"
        )
    return trained
