"""The noise floor of a paired gap (issue 52, item 5), and the word a gap below it gets.

A *rerun* is a stored run made again, same settings and seed, by the same study command into
``<study>/reruns/`` (``make early-gap ARGS=--rerun``). Its *spread* is the relative change of
the final test loss between the stored run and the rerun, and the *host spread* the largest
over the reruns: how far one config moves between the hosts that made the runs (equal configs
were seen to move by ~1% between hosts, the size of some gaps). Reruns on the host class that
made the stored runs measure only that host class; the text says which classes it covers.

A paired gap (one per seed) is **level** when its mean is no larger than the floor, the larger
of the host spread and twice the standard error of the mean over seeds (so neither a host's
last bits nor the seeds' own scatter is read as a lead); otherwise ahead or behind.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from pipelines.studies.run_index import RunIndex, RunKey, RunLog

__all__ = ["Rerun", "floor", "floor_text", "host_spread", "hosts", "reruns", "standing"]


def _cpu(run: RunLog) -> str:
    return str((run.header.get("host") or {}).get("cpu") or "host not recorded")


def _test(run: RunLog) -> float | None:
    loss = run.final.get("final_test_loss")
    return None if loss is None or run.final.get("diverged") else float(loss)


@dataclass(frozen=True)
class Rerun:
    key: RunKey
    stored_cpu: str
    rerun_cpu: str
    stored: float  # final test loss
    rerun: float

    @property
    def spread(self) -> float:
        """|rerun - stored| in % of the stored run's loss."""
        return 100.0 * abs(self.rerun - self.stored) / self.stored


def reruns(stored: RunIndex, again: RunIndex) -> list[Rerun]:
    """Every run in ``again`` with a stored twin (same key) in ``stored``, both with a test loss."""
    out = []
    for key, run in sorted(again.runs.items(), key=lambda kv: str(kv[0])):
        twin = stored.runs.get(key)
        a, b = (None, None) if twin is None else (_test(twin), _test(run))
        if a is not None and b is not None:
            out.append(Rerun(key, _cpu(twin), _cpu(run), a, b))
    return out


def hosts(index: RunIndex) -> list[str]:
    """The host classes (CPU model and vector extension) that made ``index``'s runs."""
    return sorted({_cpu(r) for r in index.runs.values()})


def host_spread(found: list[Rerun]) -> float | None:
    return max((r.spread for r in found), default=None)


def floor(gaps: list[float], spread: float | None) -> float:
    """The larger of the host spread and twice the standard error of the mean gap (in %)."""
    seeds = 2.0 * statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.inf
    return max(spread or 0.0, seeds)


def standing(gaps: list[float], spread: float | None) -> str:
    """One of level, behind or ahead (a positive gap: a higher loss than the reference's)."""
    mean = statistics.fmean(gaps)
    if abs(mean) <= floor(gaps, spread):
        return "level"
    return "behind" if mean > 0 else "ahead"


def floor_text(found: list[Rerun], made_on: list[str]) -> str:
    """One sentence: the reruns, their host spread and the host classes of the stored runs."""
    classes = "; ".join(made_on) or "no host recorded"
    rule = "level: a mean gap within twice its standard error over seeds"
    if not found:
        return f"Noise floor: no rerun yet (`--rerun`); runs made on {classes}; {rule}."
    hosts_seen = sorted({r.rerun_cpu for r in found} | {r.stored_cpu for r in found})
    same = sum(r.rerun == r.stored for r in found)
    return (f"Noise floor: {len(found)} same-config reruns on {'; '.join(hosts_seen)} moved the "
            f"test loss by at most {host_spread(found):.3f}% ({same} bit for bit); the runs "
            f"were made on {classes} only; {rule} or that spread.")  # fmt: skip
