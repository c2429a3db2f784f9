"""The quality study's finished runs, indexed: every run by (model, variant, horizon, lr,
seed), one code version per index, with the lr the protocol chooses per cell.

Every number is read from the finished runs' logs under ``<out_dir>/runs`` (loose or packed,
:mod:`pipelines.studies.run_store`; unfinished ``.partial`` files are ignored).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.studies.protocol import (
    UNSTAMPED,
    LrChoice,
    choose_lr,
    code_classes,
    load_equivalences,
    verdict_code,
)
from pipelines.studies.quality_run import FINAL
from pipelines.studies.run_store import run_texts

__all__ = [
    "REFERENCE",
    "RunIndex",
    "RunKey",
    "RunLog",
    "load_runs",
    "parse_run",
    "read_run",
    "run_key",
]


@dataclass
class RunLog:
    header: dict[str, Any]
    steps: list[dict[str, Any]]
    final: dict[str, Any]

    @property
    def model(self) -> str:
        return self.header["model"]

    @property
    def variant(self) -> str:
        return self.header["variant"]

    @property
    def step_code(self) -> str:
        """The code version that made the run (:func:`protocol.step_code`)."""
        return (self.header.get("code") or {}).get("step_code") or UNSTAMPED

    @property
    def commit(self) -> str | None:
        return (self.header.get("code") or {}).get("commit")


def parse_run(text: str) -> RunLog | None:
    """A run's JSONL log; None when the run has not finished."""
    lines = [json.loads(line) for line in text.splitlines()]
    if len(lines) < 2 or lines[-1].get("event") != FINAL:
        return None
    return RunLog(lines[0], lines[1:-1], lines[-1])


def read_run(path: Path) -> RunLog | None:
    """A run's JSONL file; None when the run has not finished."""
    return parse_run(path.read_text(encoding="utf-8"))


def load_runs(runs_dir: Path) -> list[RunLog]:
    """Every finished run under ``runs_dir``: each code version's folder or archive, and the
    unstamped runs made before runs recorded their code, at the top
    (:func:`pipelines.studies.run_store.run_texts`)."""
    runs = (parse_run(text) for _, text in run_texts(runs_dir))
    return [r for r in runs if r is not None]


REFERENCE = "adams"


@dataclass(frozen=True)
class RunKey:
    model: str
    variant: str
    steps: int
    lr_scale: float
    seed: int


def run_key(run: RunLog) -> RunKey:
    h = run.header
    steps = h.get("steps") or h["settings"]["scale"]["steps"]
    return RunKey(h["model"], h["variant"], int(steps), float(h.get("lr_scale", 1.0)), h["seed"])


class RunIndex:
    """The runs of ONE code version, by key: the version with the most runs unless ``code``
    names one (:func:`protocol.verdict_code`), with the versions a replay showed to compute
    the same bits (``equivalences``, :func:`protocol.load_equivalences`); the others are
    counted in ``left_out``."""

    def __init__(
        self,
        runs: list[RunLog],
        code: str | None = None,
        equivalences: list[dict[str, Any]] | None = None,
    ) -> None:
        self.all_runs = runs  # every code version's, for runs.csv
        self.equivalences = equivalences or []
        classes = code_classes(self.equivalences)
        self.code = code or verdict_code((r.step_code for r in runs), classes)
        self.codes = classes.get(self.code, frozenset({self.code}))
        own = Counter(r.step_code for r in runs)
        # the named version's run first, where an equivalent version has the same key
        kept = sorted((r for r in runs if r.step_code in self.codes),
                      key=lambda r: (r.step_code != self.code, -own[r.step_code], r.step_code))  # fmt: skip
        self.left_out = Counter(r.step_code for r in runs if r.step_code not in self.codes)
        self.runs: dict[RunKey, RunLog] = {}
        for r in kept:
            self.runs.setdefault(run_key(r), r)
        self.commits = sorted({r.commit for r in self.runs.values() if r.commit})
        self.dirty = sum(bool((r.header.get("code") or {}).get("dirty"))
                         for r in self.runs.values())  # fmt: skip

    @classmethod
    def load(cls, out_dir: Path, code: str | None = None) -> RunIndex:
        runs_dir = out_dir / "runs"
        return cls(load_runs(runs_dir), code, load_equivalences(runs_dir))

    def provenance(self) -> str:
        """One paragraph: which code version the tables are made of, and what was left out."""
        if self.code == UNSTAMPED:
            made = (f"**Every table here is made of {len(self.runs)} runs made before runs "
                    "recorded their code**: they span several versions of the library, and "
                    "SCAPE clipped nothing in them. The verdict at one code version is "
                    "still to be run (`make quality-study`, plans in `conf/quality/plan/`).")  # fmt: skip
        else:
            commits = ", ".join(c[:10] for c in self.commits) or "no recorded commit"
            dirty = f"; {self.dirty} from a tree with uncommitted changes" if self.dirty else ""
            made = (f"Every table here is made of the {len(self.runs)} runs of code version "
                    f"`{self.code}` (the library's step and the study's run code, torch and "
                    f"megatron-core versions; commits {commits}{dirty}).")  # fmt: skip
            joined = [r for r in self.equivalences
                      if r["code"] in self.codes and r["same_as"] in self.codes]  # fmt: skip
            if joined:
                made += " " + " ".join(
                    f"Version `{r['code']}` (commit {str(r.get('commit') or '?')[:10]}) "
                    f"replayed {len(r['runs'])} runs of `{r['same_as']}` and got the same "
                    f"bits in every logged record, so their runs share these tables."
                    for r in joined
                )
        if self.left_out:
            other = ", ".join(f"{n} of `{c}`" for c, n in sorted(self.left_out.items()))
            made += f" Left out: runs of other code versions ({other})."
        return made

    def params(self, model: str) -> int | None:
        """The model's parameter count, as its runs recorded it (None when none did)."""
        return next((r.header["params"] for k, r in self.runs.items()
                     if k.model == model and r.header.get("params")), None)  # fmt: skip

    def params_text(self, model: str) -> str:
        n = self.params(model)
        return f"{n / 1e6:.2f}M" if n else "size unknown"

    def final(self, key: RunKey) -> float | None:
        run = self.runs.get(key)
        if run is None:
            return None
        if run.final.get("diverged"):
            return math.inf
        return float(run.final["final_val_loss"])

    def lrs(self, model: str, variant: str, steps: int, seed: int) -> list[float]:
        return sorted(
            k.lr_scale
            for k in self.runs
            if (k.model, k.variant, k.steps, k.seed) == (model, variant, steps, seed)
        )

    def lr_choice(self, model: str, variant: str, steps: int) -> LrChoice | None:
        """The protocol's lr for this cell: lowest mean final loss over all its seeds."""
        finals: dict[float, dict[int, float]] = {}
        for k in self.runs:
            if (k.model, k.variant, k.steps) == (model, variant, steps):
                finals.setdefault(k.lr_scale, {})[k.seed] = self.final(k)  # type: ignore[assignment]
        return choose_lr(finals)

    def best_lr(self, model: str, variant: str, steps: int) -> float | None:
        choice = self.lr_choice(model, variant, steps)
        return None if choice is None else choice.lr

    def seeds(self, model: str, variant: str, steps: int, lr: float) -> list[int]:
        return sorted(
            k.seed
            for k in self.runs
            if (k.model, k.variant, k.steps, k.lr_scale) == (model, variant, steps, lr)
        )

    def paired_gaps(
        self, model: str, variant: str, steps: int, lr: float, ref_lr: float,
        reference: str = REFERENCE,
    ) -> list[float]:  # fmt: skip
        """Percent gap to ``reference`` (dense AdamS; at ``ref_lr``) per seed both have."""
        gaps = []
        for seed in self.seeds(model, variant, steps, lr):
            ref = self.final(RunKey(model, reference, steps, ref_lr, seed))
            val = self.final(RunKey(model, variant, steps, lr, seed))
            if ref is not None and val is not None and math.isfinite(ref):
                gaps.append(100.0 * (val - ref) / ref)
        return gaps
