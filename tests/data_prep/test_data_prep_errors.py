"""Bad input: one clear line naming problem and fix, non-zero exit, earlier outputs untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from data_prep_helpers import slice_config, tree_digest
from hydra import compose, initialize_config_dir

from data_prep import prepare as prepare_module
from data_prep.config import DataConfig, SourceKind, TokenizerConfig, TokenizerKind
from data_prep.errors import DataPrepError
from data_prep.prepare import prepare
from pipelines import prepare as stage

REPO = Path(__file__).resolve().parents[2]


def run_cli(*overrides: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "pipelines.prepare",
        *overrides,
        f"hydra.run.dir={tmp_path}/hydra",
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_unknown_name_and_missing_file(tmp_path) -> None:
    unknown = run_cli("data=nope", tmp_path=tmp_path)
    assert unknown.returncode != 0
    names = ", ".join(sorted(p.stem for p in (REPO / "conf" / "data").glob("*.yaml")))
    assert unknown.stderr.splitlines() == [
        f"error: unknown data 'nope'; use one of: {names} (or add conf/data/nope.yaml)"
    ]
    missing = run_cli(
        "data=local_files",
        "data.paths=[/nonexistent/corpus.jsonl]",
        f"output_root={tmp_path}",
        tmp_path=tmp_path,
    )
    assert missing.returncode == 1
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: data.paths: no file matches '/nonexistent/corpus.jsonl'"
    )
    assert not (tmp_path / "local_files__bytebpe4k").exists()


def test_unknown_tokenizer_name() -> None:
    problem = stage.unknown_group_choice(["data=enwiki_sample", "tokenizer=gpt3"])
    known = ", ".join(sorted(p.stem for p in (stage.CONF_DIR / "tokenizer").glob("*.yaml")))
    assert "bytebpe4k, gpt2, hf" in known
    assert (
        problem
        == f"unknown tokenizer 'gpt3'; use one of: {known} (or add conf/tokenizer/gpt3.yaml)"
    )
    assert stage.unknown_group_choice(["tokenizer=gpt2", "num_proc=2"]) is None


def test_typed_config_rejects_bad_values_at_start_up() -> None:
    with initialize_config_dir(config_dir=str(stage.CONF_DIR), version_base="1.3"):
        with pytest.raises(Exception, match="num_proc"):
            compose("prepare", overrides=["num_proc=many"])
        with pytest.raises(Exception, match="kind"):
            compose("prepare", overrides=["data.kind=ftp"])
        with pytest.raises(DataPrepError, match="needs data.paths"):
            stage.run(compose("prepare", overrides=["data=local_files"]))
        cfg = compose("prepare", overrides=["data.split_ratios=[0.5,0.5,0.5]"])
        with pytest.raises(DataPrepError, match="summing to 1"):
            stage.run(cfg)


@pytest.fixture
def refuse_work(monkeypatch) -> None:
    """Any of these errors must come before tokenization starts."""

    def must_not_run(*args, **kwargs):
        raise AssertionError("work started despite bad input")

    monkeypatch.setattr(prepare_module, "write_splits", must_not_run)
    monkeypatch.setattr(prepare_module, "train_bytebpe", must_not_run)


def test_bad_inputs_leave_earlier_output_untouched(prepared_slice, tmp_path, refuse_work) -> None:
    root = prepared_slice.path.parent
    before = tree_digest(root)
    (tmp_path / "blank.txt").write_text("  \n\n\t\n")
    blank = DataConfig(name="blank", kind=SourceKind.files, paths=[str(tmp_path / "blank.txt")])
    cases = [
        # the model was built for another vocabulary: 512 entries pad to 512, not 500
        (slice_config(root, model_vocab_size=500), "set the model's vocab_size to 512"),
        # same output directory, other inputs, no overwrite
        (slice_config(root, data=DataConfig(**{**vars(slice_config(root).data), "split_seed": 9})), "different inputs"),
        # replacing it with an empty corpus is refused even with overwrite
        (slice_config(root, data=blank, output_dir=str(prepared_slice.path), overwrite=True), "no non-empty documents"),
        # a missing file, aimed at the existing output
        (
            slice_config(root, data=DataConfig(**{**vars(blank), "paths": ["/nonexistent.txt"]}), output_dir=str(prepared_slice.path)),
            "no file matches",
        ),
    ]  # fmt: skip
    for cfg, message in cases:
        with pytest.raises(DataPrepError, match=message) as err:
            prepare(cfg)
        assert "\n" not in str(err.value)
        assert tree_digest(root) == before


def test_vocab_mismatch_fails_before_reading_anything(tmp_path, monkeypatch) -> None:
    def must_not_read(*args, **kwargs):
        raise AssertionError("the corpus was opened before the vocabulary check")

    monkeypatch.setattr(prepare_module, "open_source", must_not_read)
    gpt2 = TokenizerConfig(name="gpt2", kind=TokenizerKind.gpt2, vocab_size=50257)
    with pytest.raises(DataPrepError, match="padded to 50304"):
        prepare(slice_config(tmp_path, tokenizer=gpt2, model_vocab_size=50257))


def test_split_without_documents_is_an_error(tmp_path) -> None:
    tiny = DataConfig(
        name="two",
        kind=SourceKind.embedded,
        embedded="enwiki_sample",
        max_documents=2,
        split_ratios=[0.8, 0.1, 0.1],
    )
    gpt2 = TokenizerConfig(name="gpt2", kind=TokenizerKind.gpt2)
    with pytest.raises(DataPrepError, match="split 'validation' got no documents"):
        prepare(slice_config(tmp_path, data=tiny, tokenizer=gpt2))
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_output_from_other_inputs(tmp_path) -> None:
    data = DataConfig(
        name="four",
        kind=SourceKind.embedded,
        embedded="enwiki_sample",
        max_documents=4,
        split_ratios=[0.5, 0.25, 0.25],
    )
    gpt2 = TokenizerConfig(name="gpt2", kind=TokenizerKind.gpt2)
    first = prepare(slice_config(tmp_path, data=data, tokenizer=gpt2))
    reseeded = DataConfig(**{**vars(data), "split_seed": 9})
    second = prepare(slice_config(tmp_path, data=reseeded, tokenizer=gpt2, overwrite=True))
    assert second.path == first.path and not second.skipped
    assert second.metadata["fingerprint"] != first.metadata["fingerprint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["four__gpt2"]  # no leftovers
