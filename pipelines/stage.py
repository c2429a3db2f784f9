"""What every Hydra stage's entry point shares: its typed config registered under
``<name>_schema`` (the default its conf/<name>.yaml starts from), and expected errors turned
into one line on stderr and an exit status instead of a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.core.config_store import ConfigStore

__all__ = ["command_line", "one_line_errors", "register_schema"]


def register_schema(name: str, schema: type) -> None:
    """Make conf/<name>.yaml's ``<name>_schema`` default resolve to the typed dataclass, so a
    bad value fails at start-up."""
    ConfigStore.instance().store(name=f"{name}_schema", node=schema)


@contextmanager
def one_line_errors(*errors: type[Exception], status: int = 2, hint: str = "") -> Iterator[None]:
    """Inside a stage's ``main``: one of ``errors`` prints ``error: <message><hint>`` on stderr
    and exits with ``status``; anything else is a bug and keeps its traceback."""
    try:
        yield
    except errors as err:
        print(f"error: {err}{hint}", file=sys.stderr)
        sys.exit(status)


def command_line(module: str) -> str:
    """The command that started this Hydra run (``python -m <module> <overrides>``), for the
    record a stage writes beside its output."""
    from hydra.core.hydra_config import HydraConfig

    return f"python -m {module} {' '.join(HydraConfig.get().overrides.task)}".strip()
