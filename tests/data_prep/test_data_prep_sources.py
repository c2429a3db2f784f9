"""Corpus sources and split assignment, without tokenizing anything."""

from __future__ import annotations

import gzip
import sys
import types
from itertools import islice

import pytest

from data_prep.config import DataConfig, SourceKind
from data_prep.errors import DataPrepError
from data_prep.sources import embedded, files, hub, open_source
from data_prep.splits import assign_splits


def files_config(*paths: str, **fields: object) -> DataConfig:
    return DataConfig(name="local", kind=SourceKind.files, paths=list(paths), **fields)


def test_embedded_corpus_is_clean_real_text() -> None:
    docs = list(islice(embedded.iter_documents("enwiki_sample"), 5))
    assert docs[0].startswith("Anarchism\n\nAnarchism is a political philosophy")
    for doc in docs:
        assert "'''" not in doc and "==" not in doc and "\n\n\n" not in doc
        assert not doc.lower().startswith("#redirect")
    # replaying the memoized prefix yields the same documents
    assert list(islice(embedded.iter_documents("enwiki_sample"), 5)) == docs


def test_unknown_embedded_corpus() -> None:
    cfg = DataConfig(name="x", kind=SourceKind.embedded, embedded="nope")
    with pytest.raises(DataPrepError, match="unknown embedded corpus 'nope'"):
        open_source(cfg)


def test_local_formats_and_fingerprint(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "first"}\n\n{"text": "second", "id": 2}\n')
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("para one\n\npara two\n\n  \n\npara three")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["from parquet", None]}), tmp_path / "c.parquet")

    cfg = files_config(
        str(tmp_path / "*.jsonl"), str(tmp_path / "b.txt.gz"), str(tmp_path / "c.parquet")
    )
    cfg.document_separator = "\n\n"
    source = open_source(cfg)
    assert list(source.documents()) == [
        "first", "second", "para one", "para two", "para three", "from parquet",
    ]  # fmt: skip
    assert [f["name"] for f in source.fingerprint["files"]] == ["a.jsonl", "b.txt.gz", "c.parquet"]
    again = open_source(cfg).sha256
    (tmp_path / "a.jsonl").write_text('{"text": "changed"}\n')
    assert open_source(cfg).sha256 != again


def test_txt_separator_split_across_read_chunks(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(files, "_CHUNK", 7)  # separators straddle chunk boundaries
    (tmp_path / "c.txt").write_text("alpha\n\nbeta gamma\n\ndelta\n\n")
    source = open_source(files_config(str(tmp_path / "c.txt"), document_separator="\n\n"))
    assert list(source.documents()) == ["alpha", "beta gamma", "delta"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", b'{"text": "ok"}\n{not json\n', "line 2: not valid JSON"),
        ("field.jsonl", b'{"body": "x"}\n', "line 1: no string field 'text'"),
        ("latin1.txt", "café".encode("latin-1"), "not UTF-8"),
        (
            "cut.jsonl.gz",
            # mtime=0: the same bytes, so the same test id, in every pytest -n worker
            gzip.compress(b'{"text": "x"}\n' * 100, mtime=0)[:-12],
            "check the file is complete",
        ),
    ],
)
def test_bad_file_content(tmp_path, name, content, message) -> None:
    (tmp_path / name).write_bytes(content)
    source = open_source(files_config(str(tmp_path / name)))
    with pytest.raises(DataPrepError, match=message):
        list(source.documents())


def test_missing_and_unreadable_files(tmp_path, monkeypatch) -> None:
    with pytest.raises(DataPrepError, match="no file matches"):
        open_source(files_config(str(tmp_path / "absent*.jsonl")))
    (tmp_path / "doc.csv").write_text("a,b\n")
    with pytest.raises(DataPrepError, match="unsupported corpus file"):
        open_source(files_config(str(tmp_path / "doc.csv")))

    locked = tmp_path / "locked.txt"
    locked.write_text("secret")

    def deny(path, *args, **kwargs):  # tests run as root, so chmod cannot deny a read
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(files, "open", deny, raising=False)
    with pytest.raises(DataPrepError, match="cannot read corpus file .*Permission denied"):
        open_source(files_config(str(locked)))


def test_hub_iteration_with_local_stand_in(monkeypatch) -> None:
    """The real code path (`from datasets import load_dataset`) with a fake `datasets`."""
    calls = []

    def load_dataset(name, config, split, streaming, revision):
        calls.append((name, config, split, streaming, revision))
        return iter([{"text": "doc one"}, {"text": "   "}, {"text": "doc two"}, {"text": "doc 3"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(hub, "require_hub", lambda what: None)
    cfg = DataConfig(
        name="owt", kind=SourceKind.hub, hub_name="Skylion007/openwebtext", max_documents=2
    )
    source = open_source(cfg)
    assert list(source.documents()) == ["doc one", "doc two"]  # blank skipped, capped at 2
    assert calls == [("Skylion007/openwebtext", None, "train", True, None)]
    assert source.fingerprint["hub_revision"] == "unpinned"


def test_hub_errors_are_one_line(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'x' on the Hub (LocalEntryNotFoundError)\nmore")

    with pytest.raises(DataPrepError, match=r"could not stream .*ConnectionError") as err:
        list(hub.iter_hub_documents("x", None, "train", None, "text", load_dataset=broken))
    assert "\n" not in str(err.value)

    def no_field(*args, **kwargs):
        return [{"content": "x"}]

    with pytest.raises(DataPrepError, match="no string field 'text'"):
        list(hub.iter_hub_documents("x", None, "train", None, "text", load_dataset=no_field))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=5.0: False)
    with pytest.raises(DataPrepError, match="unreachable"):
        list(hub.iter_hub_documents("x", None, "train", None, "text"))


def test_splits_are_deterministic_balanced_prefixes() -> None:
    ratios = [0.9, 0.05, 0.05]
    first = list(islice(assign_splits(ratios, seed=1234), 2000))
    assert first == list(islice(assign_splits(ratios, seed=1234), 2000))
    assert first != list(islice(assign_splits(ratios, seed=7), 2000))
    counts = [0, 0, 0]
    for n, split in enumerate(first, start=1):  # every prefix is close to the exact ratios
        counts[split] += 1
        assert all(abs(c - r * n) <= 3 for c, r in zip(counts, ratios, strict=True))
    assert 2 not in islice(assign_splits([0.9, 0.1, 0.0], seed=1), 500)
