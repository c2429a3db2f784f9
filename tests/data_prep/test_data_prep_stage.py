"""The whole stage on a slice of the embedded corpus: content, determinism, Megatron read-back."""

from __future__ import annotations

import shutil
from itertools import islice

import pytest
from data_prep_helpers import SLICE_DOCUMENTS, dead_pid, slice_config, tree_digest

from data_prep import prepare as prepare_module
from data_prep.config import SPLIT_NAMES, DataConfig, SourceKind, TokenizerConfig, TokenizerKind
from data_prep.dataset import check_prepared, load_prepared
from data_prep.errors import DataPrepError
from data_prep.prepare import prepare
from data_prep.sources import embedded
from data_prep.splits import assign_splits
from data_prep.writer import import_megatron_indexed_dataset


def test_documents_round_trip_through_the_indexed_files(prepared_slice) -> None:
    """Every source document comes back, in its split, EOD-terminated and exactly decoded."""
    prepared = load_prepared(prepared_slice.path)
    tokenizer = prepared.build_tokenizer()
    indexed = import_megatron_indexed_dataset()
    datasets = {name: indexed.IndexedDataset(prepared.prefix(name)) for name in SPLIT_NAMES}
    position = dict.fromkeys(SPLIT_NAMES, 0)
    docs = islice(embedded.iter_documents("enwiki_sample"), SLICE_DOCUMENTS)
    for doc, split in zip(docs, assign_splits([0.8, 0.1, 0.1], seed=1234), strict=False):
        name = SPLIT_NAMES[split]
        ids = datasets[name][position[name]]
        position[name] += 1
        assert ids[-1] == tokenizer.eod and tokenizer.eod not in ids[:-1]
        assert tokenizer.detokenize(ids[:-1].tolist()) == doc
    for name in SPLIT_NAMES:
        recorded = prepared.metadata["splits"][name]
        assert position[name] == recorded["documents"] == len(datasets[name]) > 0
        assert int(datasets[name].sequence_lengths.sum()) == recorded["tokens"]


def test_gpt_dataset_reads_the_splits(prepared_slice) -> None:
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prepared = load_prepared(prepared_slice.path)
    tokenizer = prepared.build_tokenizer()
    seq = 64
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=seq,
        blend_per_split=[([prepared.prefix(name)], None) for name in SPLIT_NAMES],
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    splits = BlendedMegatronDatasetBuilder(GPTDataset, [None] * 3, lambda: True, config).build()
    for name, gpt in zip(SPLIT_NAMES, splits, strict=True):
        recorded = prepared.metadata["splits"][name]
        assert len(gpt.dataset) == recorded["documents"]
        # one epoch of seq-long samples (plus the extra label token) over all recorded tokens
        assert len(gpt) == (recorded["tokens"] - 1) // seq
        sample = gpt[0]
        assert sample["tokens"].shape == (seq,)
        assert int(sample["tokens"].max()) < tokenizer.vocab_size


def test_second_run_is_byte_identical_and_does_no_work(
    prepared_slice, tmp_path, monkeypatch
) -> None:
    # a fresh run elsewhere, with two workers: same bytes, same fingerprint
    other = prepare(slice_config(tmp_path, num_proc=2))
    assert not other.skipped and other.report.num_proc == 2
    assert other.metadata["fingerprint"] == prepared_slice.metadata["fingerprint"]
    data_files = [f"{s}.{ext}" for s in SPLIT_NAMES for ext in ("bin", "idx")] + ["tokenizer.json"]
    before = tree_digest(prepared_slice.path)
    assert {f: tree_digest(other.path)[f] for f in data_files} == {f: before[f] for f in data_files}
    assert "tokens/s" in other.summary()

    # the same inputs again: nothing is tokenized or written
    def must_not_run(*args, **kwargs):
        raise AssertionError("the second run redid work")

    monkeypatch.setattr(prepare_module, "write_splits", must_not_run)
    monkeypatch.setattr(prepare_module, "train_bytebpe", must_not_run)
    again = prepare(slice_config(prepared_slice.path.parent))
    assert again.skipped and again.metadata == prepared_slice.metadata
    assert tree_digest(prepared_slice.path) == before


@pytest.mark.parametrize(
    ("tokenizer", "vocab", "eod"), [("gpt2", 50257, 50256), ("sentencepiece", 32000, 2)]
)
def test_fixed_tokenizers_prepare(tmp_path, tokenizer, vocab, eod) -> None:
    cfg = slice_config(
        tmp_path,
        tokenizer=TokenizerConfig(name=tokenizer, kind=TokenizerKind(tokenizer), vocab_size=vocab),
        data=DataConfig(
            name="tiny",
            kind=SourceKind.embedded,
            embedded="enwiki_sample",
            max_documents=4,
            split_ratios=[0.5, 0.25, 0.25],
        ),  # fmt: skip
    )
    result = prepare(cfg)
    assert (result.metadata["tokenizer"]["eod"], result.metadata["dtype"]) == (eod, "uint16")
    reloaded = load_prepared(result.path).build_tokenizer()
    assert (reloaded.vocab_size, reloaded.eod) == (vocab, eod)
    check_prepared(result.path, reloaded)
    assert not (result.path / "tokenizer.json").exists()


def test_prepared_data_rejects_another_tokenizer(prepared_slice) -> None:
    from data_prep.tokenizers import build_tokenizer

    gpt2 = build_tokenizer(TokenizerConfig(name="gpt2", kind=TokenizerKind.gpt2))
    with pytest.raises(DataPrepError, match="different tokenizer"):
        check_prepared(prepared_slice.path, gpt2)


def test_interrupted_run_leaves_nothing_under_the_final_name(tmp_path, monkeypatch) -> None:
    stale = tmp_path / f".enwiki_slice__bytebpe512.tmp-{dead_pid()}"  # a killed run's leftovers
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"half")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "write_splits", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare(slice_config(tmp_path))
    assert list(tmp_path.iterdir()) == []  # no final directory, no temporary, stale one gone


def test_corrupt_output_is_reported_and_kept(prepared_slice, tmp_path) -> None:
    for damage, message in [
        ("truncate_bin", "does not hold"),
        ("flip_bin", "differs"),
        ("truncate_idx", "idx"),
    ]:
        copy = tmp_path / damage
        shutil.copytree(prepared_slice.path, copy)
        target = copy / ("train.idx" if damage.endswith("idx") else "train.bin")
        data = bytearray(target.read_bytes())
        if damage == "flip_bin":
            data[100] ^= 0xFF
        else:
            data = data[:-6]
        target.write_bytes(bytes(data))
        damaged = tree_digest(copy)
        with pytest.raises(DataPrepError, match=f"corrupt: .*{message}"):
            prepare(slice_config(tmp_path, output_dir=str(copy)))
        assert tree_digest(copy) == damaged  # reported, not silently rebuilt or deleted
