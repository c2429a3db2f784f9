"""Fixtures of the pipelines tests: the stages', the training runtime's and the studies'."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def compose_study():
    """The quality study's config as the stage resolves it, composed from conf/ with overrides."""
    from hydra import compose, initialize_config_dir

    from pipelines.quality_study import resolve
    from pipelines.studies.quality_config import QualityStudyConfig

    def compose_study(*overrides: str) -> QualityStudyConfig:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return resolve(compose(config_name="quality_study", overrides=list(overrides)))

    return compose_study


@pytest.fixture(scope="session")
def prepared_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 articles of the embedded corpus with a 512-entry BPE (about a second)."""
    from data_prep.config import (
        DataConfig,
        PrepareConfig,
        SourceKind,
        TokenizerConfig,
        TokenizerKind,
    )
    from data_prep.prepare import prepare

    cfg = PrepareConfig(
        data=DataConfig(
            name="enwiki_slice",
            kind=SourceKind.embedded,
            embedded="enwiki_sample",
            max_documents=16,
            split_ratios=[0.8, 0.1, 0.1],
        ),
        tokenizer=TokenizerConfig(name="bytebpe512", kind=TokenizerKind.bytebpe, vocab_size=512),
        output_root=str(tmp_path_factory.mktemp("prepared")),
        num_proc=1,
        progress=False,
    )
    return prepare(cfg).path


@pytest.fixture
def commit_all():
    """``commit_all(repo, message)``: ``git init`` (once), add every file and commit: a
    checkout whose commit a run can record."""
    import subprocess

    def commit(repo: Path, message: str = "one") -> None:
        def git(*args: str) -> None:
            subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                           cwd=repo, check=True, capture_output=True)  # fmt: skip

        if not (repo / ".git").exists():
            git("init", "-q")
        git("add", ".")
        git("commit", "-qm", message)

    return commit
