"""Shared fixtures: a small prepared slice of the embedded corpus and a tiny exported model.

The model is randomly initialized (seeded): every test here checks plumbing and arithmetic,
not quality. Everything is built once per session because importing
megatron-core and building a model is most of this directory's run time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_test_helpers import SHAPE, VOCAB

from data_prep.config import DataConfig, PrepareConfig, SourceKind, TokenizerConfig, TokenizerKind
from data_prep.dataset import PreparedData, load_prepared
from data_prep.prepare import prepare


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    # 24 articles with 20% held out for test: ~5 test documents, enough for distractors
    cfg = PrepareConfig(
        data=DataConfig(
            name="enwiki_eval",
            kind=SourceKind.embedded,
            embedded="enwiki_sample",
            max_documents=24,
            split_ratios=[0.6, 0.2, 0.2],
        ),
        tokenizer=TokenizerConfig(name="bytebpe500", kind=TokenizerKind.bytebpe, vocab_size=VOCAB),
        output_root=str(tmp_path_factory.mktemp("prepared")),
        num_proc=1,
        progress=False,
    )
    result = prepare(cfg)
    assert result.metadata["tokenizer"]["vocab_size"] == VOCAB
    return load_prepared(result.path)


@pytest.fixture(scope="session")
def export(prepared: PreparedData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from eval.export import build_model, export_model

    model = build_model(SHAPE)
    return export_model(
        model, SHAPE, prepared.path, tmp_path_factory.mktemp("run") / "export", step=7
    )


@pytest.fixture(scope="session")
def loaded(export: Path):
    from eval.export import load_exported

    return load_exported(export)
