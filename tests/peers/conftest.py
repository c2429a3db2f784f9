import pytest
from peers_common import run_suites

from scape.spawn import run_distributed


@pytest.fixture(scope="session")
def ranks():
    """Per rank (3): ``allreduce3`` and, on ranks 0 and 1, ``{test module: its suite result}``."""
    return run_distributed(run_suites, 3, timeout_s=300)
