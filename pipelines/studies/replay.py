"""Replays: does this code compute the same bits as the code an older run was made with?

A table may hold runs of two code versions only where a replay showed the versions compute
the same numbers (issue 27): a refactor of the step's files should force no re-run, a change
to its arithmetic must. :func:`replay_set` picks one stored run per (model, method) of the
older version, the cheapest; the study re-runs each with today's code
(``python -m pipelines.quality_study replay=true``) and :func:`differences` compares every
logged record (each 10 steps' loss, lr, gradient norm and bytes, every validation loss, the
final loss) bit for bit. Only when every replay matches does the study record the versions
as one (:func:`pipelines.studies.protocol.record_equivalence`).
"""

from __future__ import annotations

import math
from typing import Any

from pipelines.studies.quality_config import ModelSpec, RunSpec, ScaleConfig, VariantSpec
from pipelines.studies.run_index import RunLog, run_key

__all__ = ["differences", "replay_set", "spec_of"]


def replay_set(runs: list[RunLog], code: str) -> list[RunLog]:
    """One run of code version ``code`` per (model, variant): the shortest horizon, then the
    lowest seed, then the lr scale nearest 1."""
    best: dict[tuple[str, str], tuple[tuple[float, ...], RunLog]] = {}
    for run in runs:
        if run.step_code != code:
            continue
        key = run_key(run)
        cost = (key.steps, key.seed, abs(math.log(key.lr_scale)), key.lr_scale)
        cell = (key.model, key.variant)
        if cell not in best or cost < best[cell][0]:
            best[cell] = (cost, run)
    return [best[cell][1] for cell in sorted(best)]


def spec_of(run: RunLog, data_dir: str) -> RunSpec:
    """The :class:`RunSpec` a stored run was made from, rebuilt from its header's settings.
    Raises ValueError when today's config types cannot rebuild it (its fingerprint differs)."""
    h = run.header
    s = h["settings"]
    spec = RunSpec(
        model=ModelSpec(**s["model"]),
        variant_name=h["variant"],
        variant=VariantSpec(**s["variant"]),
        seed=h["seed"],
        scale=ScaleConfig(**s["scale"]),
        data_dir=data_dir,
        lr_scale=float(h.get("lr_scale", 1.0)),
    )
    if spec.fingerprint() != h["fingerprint"]:
        raise ValueError(
            f"run {h['run_id']}: today's config rebuilds it with fingerprint "
            f"{spec.fingerprint()}, not its {h['fingerprint']}; the settings' meaning changed, "
            f"so the versions cannot be compared by a replay: re-run it instead"
        )
    return spec


def _without(record: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in keys}


def differences(stored: RunLog, replayed: RunLog) -> str | None:
    """None when ``replayed`` logged the same bits as ``stored`` (the header but its code
    stamp, its host and its echo of the settings, whose fingerprint it keeps; every step record; the
    final record but its wall time); else where it first differs."""
    ignored = ("code", "settings", "host")  # what made the run, not what it logged
    if _without(stored.header, *ignored) != _without(replayed.header, *ignored):
        return "the headers differ"
    for a, b in zip(stored.steps, replayed.steps, strict=False):
        if a != b:
            key = next(k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k))
            return f"step {a.get('step')}: {key} {a.get(key)!r} then, {b.get(key)!r} now"
    if len(stored.steps) != len(replayed.steps):
        return f"{len(stored.steps)} step records then, {len(replayed.steps)} now"
    if _without(stored.final, "seconds") != _without(replayed.final, "seconds"):
        return "the final records differ"
    return None
