"""The verdict at GPU scale, a few runs at a time (issue 41): the plan, what is done, what runs next.

A lent H200 comes for about 15 minutes, starts included, so the GPU-scale cells (the ~52M
Llama and a ~125M GPT of ``conf/quality/scale/gpu.yaml``; dense AdamS and AdamW, SCAPE-90
and SCAPE-99; a 3-point lr grid each; 2 seeds) run as a queue:

* :func:`plan` lists every run in the order the verdict needs them: per model, seed 0 at
  each method's grid centre first (one paired cell per method as early as possible), then the
  grid's edges, then seed 1.
* :func:`lr_grid` places a method's grid by the recipe (``results/quality/recipe.json``):
  three powers of two around its family's rule multiplier, leaning toward x1 so that the
  shipped lr is on the grid wherever the rule is within x4 of it.
* A run is done when its record (``<records>/<code version>/<run id>.jsonl``, committed
  under ``results/quality/gpu/runs``) finished with the run's fingerprint at this code
  version or one a replay joined to it (the protocol: a table holds one code version's bits).
* :func:`next_runs` takes, in plan order, the runs whose estimated time still fits the
  window (:func:`estimate_seconds`: the records' own seconds per step where there are any).

``scripts/gpu_quality.py`` runs them and writes each finished record at once, so a cut
window keeps what finished.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.studies.protocol import code_classes, load_equivalences
from pipelines.studies.quality_config import ModelSpec, RunSpec, ScaleConfig, VariantSpec
from pipelines.studies.quality_run import completed_log
from pipelines.studies.run_store import run_text, run_texts

__all__ = [
    "GPU_DATA",
    "GPU_METHODS",
    "GPU_RECORDS",
    "GPU_SCALE",
    "GPU_SEEDS",
    "Queued",
    "approx_params",
    "done_runs",
    "estimate_seconds",
    "load_gpu_scale",
    "load_recipe",
    "lr_grid",
    "measured_seconds_per_step",
    "next_runs",
    "plan",
]

GPU_METHODS = ("adams", "scape99_ramp", "scape90", "adamw")  # the verdict's first pair first
GPU_SEEDS = (0, 1)
GPU_SCALE = "conf/quality/scale/gpu.yaml"  # relative to the repository
GPU_DATA = "data/debian_docs__bytebpe1k"  # make gpu-corpus; its name is in the fingerprints
GPU_RECORDS = "results/quality/gpu"  # runs/<code version>/<run id>.jsonl under it
# Before any record of a model exists: seconds per step of dense AdamS on the ~52M Llama
# (51.9M parameters, 1,000 steps in 173 s on an H200, results/gpu/gpu_quality_partial_20261204),
# carried to other sizes by parameter count. SCAPE's step costs more: its fused step made a
# GPT-345M adapter step x1.56 dense AdamS's on the H200 (results/gpu/README.md); in the
# simulator four workers' forward and backward passes share each step, so less.
SECONDS_PER_STEP_PER_PARAM = 0.173 / 51_917_568
SPARSE_FACTOR = 1.3
START_SECONDS = 30.0  # per run: data, model, compile


@dataclass(frozen=True)
class Queued:
    """One run of the GPU queue, and the spec that fixes its numbers."""

    spec: RunSpec
    grid_rank: int  # 0: the grid's centre, 1: an edge

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def model(self) -> str:
        return self.spec.model.name

    @property
    def variant(self) -> str:
        return self.spec.variant_name


def lr_grid(recipe: dict[str, Any], method: str, family: str) -> tuple[float, float, float]:
    """Three lr multipliers (of the scale's lr) a factor 2 apart, centred on the power of two
    halfway (in log) from x1 toward the recipe's rule for ``method`` on ``family``, rounded
    toward the rule: rule x4 or x2 -> (1, 2, 4); x1 -> (0.5, 1, 2); x0.5 -> (0.25, 0.5, 1).
    Methods the recipe does not cover (the dense ones) centre on x1."""
    families = recipe.get("methods", {}).get(method, {}).get("families", {})
    rule = float((families.get(family) or {}).get("multiplier") or 1.0)
    half = math.log2(rule) / 2
    centre = 2.0 ** (math.ceil(half) if half > 0 else math.floor(half))
    return (centre / 2, centre, centre * 2)


def plan(
    models: list[ModelSpec],
    variants: dict[str, VariantSpec],
    scale: ScaleConfig,
    data_dir: str,
    recipe: dict[str, Any],
    *,
    methods: Iterable[str] = GPU_METHODS,
    seeds: Iterable[int] = GPU_SEEDS,
) -> list[Queued]:
    """Every run of the GPU cells, in the order the verdict needs them (module docstring)."""
    methods, seeds = list(methods), list(seeds)
    unknown = [m for m in methods if m not in variants]
    if unknown:
        raise ValueError(f"GPU queue: methods {unknown} are not variants of the quality study")
    runs = []
    for model in models:
        for seed in seeds:
            for rank in (0, 1):
                for method in methods:
                    grid = lr_grid(recipe, method, model.family)
                    for lr in (grid[1],) if rank == 0 else (grid[0], grid[2]):
                        spec = RunSpec(model=model, variant_name=method, variant=variants[method],
                                       seed=seed, scale=scale, data_dir=data_dir, lr_scale=lr)  # fmt: skip
                        runs.append(Queued(spec, rank))
    return runs


def done_runs(records: Path, code: str, runs: list[Queued]) -> dict[str, dict[str, Any]]:
    """``{run id: final record}`` of the runs finished under ``records`` with their own
    fingerprint, at code version ``code`` or one a replay joined to it."""
    joined = code_classes(load_equivalences(records)).get(code, {code})
    done = {}
    for run in runs:
        for version in sorted(joined, key=lambda c: c != code):
            final = completed_log(run_text(records, f"{version}/{run.run_id}.jsonl"),
                                  run.spec.fingerprint())  # fmt: skip
            if final is not None:
                done[run.run_id] = final
                break
    return done


def measured_seconds_per_step(records: Path) -> dict[tuple[str, str], float]:
    """Seconds per step by (model, variant), over every finished record of any code version
    (the time a run takes, not its bits: any version tells it)."""
    per: dict[tuple[str, str], list[float]] = {}
    for _, text in run_texts(records):
        lines = text.splitlines()
        if len(lines) < 2:
            continue
        header, last = json.loads(lines[0]), json.loads(lines[-1])
        if last.get("event") == "final" and last.get("steps"):
            key = (header["model"], header["variant"])
            per.setdefault(key, []).append(last["seconds"] / last["steps"])
    return {key: sum(v) / len(v) for key, v in per.items()}


def approx_params(model: ModelSpec) -> int:
    """The transformer layers' weights (embeddings and norms left out: small at a 1k
    vocabulary), for the first estimate of a model with no record yet."""
    h, ffn = model.hidden_size, model.ffn_hidden_size
    heads, groups = model.num_attention_heads, model.num_query_groups or model.num_attention_heads
    attention = 2 * h * h + 2 * h * (h // heads) * groups  # q and out; k and v per group
    mlp = (3 if model.family == "llama" else 2) * h * ffn  # SwiGLU has a gate
    return model.num_layers * (attention + mlp)


def estimate_seconds(run: Queued, params: int, measured: dict[tuple[str, str], float]) -> float:
    """Wall seconds ``run`` should take, start-up included: its (model, variant)'s measured
    seconds per step; else the mean of its model's other variants of the same kind (dense or
    SCAPE); else of the other kind, times or over SPARSE_FACTOR; else the default per
    parameter."""
    sparse = run.spec.variant.method == "scape"
    per_step = measured.get((run.model, run.variant))
    if per_step is None:
        kinds: dict[bool, list[float]] = {True: [], False: []}
        for (model, variant), seconds in measured.items():
            if model == run.model:
                kinds[variant.startswith("scape")].append(seconds)
        if kinds[sparse]:
            per_step = sum(kinds[sparse]) / len(kinds[sparse])
        elif kinds[not sparse]:
            other = sum(kinds[not sparse]) / len(kinds[not sparse])
            per_step = other * SPARSE_FACTOR if sparse else other / SPARSE_FACTOR
        else:
            per_step = SECONDS_PER_STEP_PER_PARAM * params * (SPARSE_FACTOR if sparse else 1.0)
    return START_SECONDS + per_step * run.spec.scale.steps


def next_runs(
    runs: list[Queued], done: Iterable[str], estimates: dict[str, float], budget_s: float
) -> list[Queued]:
    """In plan order, the runs not done whose estimates still fit in ``budget_s`` together
    (a run that does not fit is passed over for a later, shorter one)."""
    finished, chosen, left = set(done), [], budget_s
    for run in runs:
        if run.run_id in finished:
            continue
        if estimates[run.run_id] <= left:
            chosen.append(run)
            left -= estimates[run.run_id]
    return chosen


def load_gpu_scale(path: Path) -> ScaleConfig:
    """The GPU scale preset as the study types it (its models included)."""
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(ScaleConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def load_recipe(path: Path) -> dict[str, Any]:
    """The recipe's JSON, or an empty one (every grid centred on x1) where none is committed."""
    return json.loads(path.read_text()) if path.is_file() else {}
