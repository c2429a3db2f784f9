"""The error every replica check raises: dense and SCAPE data-parallel replicas alike."""

from __future__ import annotations

__all__ = ["ReplicaDivergence"]


class ReplicaDivergence(RuntimeError):
    """Data-parallel replicas no longer hold identical params or masks."""
