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
