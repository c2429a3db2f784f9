"""Shared fixture: a small slice of the embedded corpus, prepared once per test session."""

from __future__ import annotations

import pytest
from data_prep_helpers import slice_config

from data_prep.prepare import PrepareResult, prepare


@pytest.fixture(scope="session")
def prepared_slice(tmp_path_factory: pytest.TempPathFactory) -> PrepareResult:
    return prepare(slice_config(tmp_path_factory.mktemp("prepared")))
