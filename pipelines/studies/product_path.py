"""`make quality-product-path`: does the verdict carry over to the runs users make?

The verdict's runs take the study's path: the simulator's contiguous parameter layout, the
study's schedule (:func:`~pipelines.studies.quality_run.lr_at`, its cosine one step behind
Megatron's) and one micro-batch per worker. A user's ``train.engine=simulator`` pretrain run
takes Megatron's bucket layout, Megatron's scheduler and the pretrain micro-batch size:
``scale.path=product``, which trains that run bit for bit
(``tests/pipelines/studies/test_product_path.py``). The layout decides which entries share a
SCAPE chunk and a shard, so it can move SCAPE's loss where it cannot move dense AdamS's.

This trains the verdict's finalists at one horizon both ways, side by side on this host, each
at the lr the verdict chose for it there and on every seed, and reports each method's gap to
dense AdamS on each path (paired by seed, as the verdict does) and how far the product path
moves it. The runs are packed in ``results/quality/product_path/runs.tar.xz`` and the table
recomputes from them (``--report-only``).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import statistics
import tarfile
import time
from pathlib import Path
from typing import Any

from pipelines.studies.quality_config import PATHS, RunSpec

__all__ = ["gaps", "main", "plan", "report", "table_lines"]

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "results" / "quality" / "product_path"
REFERENCE = "adams"
VARIANTS = ("adams", "adamw", "scape90", "scape99_ramp")


def plan(steps: int, seeds: list[int], variants: tuple[str, ...]) -> list[RunSpec]:
    """Every (model, variant, seed) of the verdict at ``steps`` and its chosen lr, on both
    paths: each rebuilt from the verdict's own stored run (its settings, checked against its
    fingerprint), so the study's side is that run."""
    from omegaconf import OmegaConf

    from pipelines.studies.replay import spec_of
    from pipelines.studies.report_stats import VERDICT_MODELS
    from pipelines.studies.run_index import RunIndex, RunKey

    # the study's data, found from anywhere (a run's fingerprint names only its folder's name)
    data_dir = str(REPO / OmegaConf.load(REPO / "conf" / "quality_study.yaml").data_dir)
    index = RunIndex.load(REPO / "results" / "quality")  # the verdict's code version
    runs = []
    for model in VERDICT_MODELS:
        for name in variants:
            choice = index.lr_choice(model, name, steps)
            if choice is None or not choice.closed:
                raise SystemExit(f"{model} {name} at {steps} steps: the verdict has no closed "
                                 "lr grid there; pick a horizon it has (--steps)")  # fmt: skip
            for seed in seeds:
                stored = index.runs.get(RunKey(model, name, steps, choice.lr, seed))
                if stored is None:
                    raise SystemExit(f"{model} {name} at {steps} steps: the verdict has no run "
                                     f"of seed {seed}; use its seeds (--seeds)")  # fmt: skip
                spec = spec_of(stored, data_dir)
                for path in PATHS:
                    at = dataclasses.replace(spec.scale, path=path)
                    runs.append(dataclasses.replace(spec, scale=at))
    return runs


def train(runs: list[RunSpec], out: Path) -> None:
    """Each run into ``out/<path>/`` (a finished one is skipped, an interrupted one resumes)."""
    import torch

    from pipelines.studies.protocol import code_version
    from pipelines.studies.quality_run import init_megatron_single_process
    from pipelines.studies.study_trainer import StudyTrainer

    torch.set_num_threads(1)
    init_megatron_single_process()
    trainer = StudyTrainer(code_version(REPO), cache_dir=REPO / "outputs" / "quality_cache",
                           checkpoint_s=120.0)  # fmt: skip
    for i, spec in enumerate(runs, 1):
        start = time.perf_counter()
        final = trainer(spec, out / spec.scale.path)
        print(f"[{i}/{len(runs)}] {spec.scale.path} {spec.run_id}: "
              f"val {final['final_val_loss']:.4f} ({time.perf_counter() - start:.0f}s)", flush=True)  # fmt: skip


def pack(out: Path, archive: Path) -> None:
    """The finished runs' logs, ``<path>/<run_id>.jsonl``, into one xz archive."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz") as tar:
        for log in sorted(out.glob("*/*.jsonl")):
            info = tar.gettarinfo(str(log), arcname=str(log.relative_to(out)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(log, "rb") as f:
                tar.addfile(info, f)


def read_archive(archive: Path) -> list[dict[str, Any]]:
    """Each run's header and final record, with its path."""
    runs = []
    with tarfile.open(archive, "r:xz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            file = tar.extractfile(member)
            assert file is not None
            lines = io.TextIOWrapper(file, encoding="utf-8").read().splitlines()
            header, final = json.loads(lines[0]), json.loads(lines[-1])
            path = header["settings"]["scale"].get("path", "study")
            runs.append({"path": path, "header": header, "final": final})
    return runs


def _mean_sd(values: list[float]) -> dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "n": len(values)}


def gaps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model and variant: each path's final loss and gap to dense AdamS (%, per seed
    against the AdamS run of the same path and seed), and the product path's change of the
    gap (paired by seed)."""
    final: dict[tuple[str, str, str, int], float] = {}
    for run in runs:
        h = run["header"]
        final[(run["path"], h["model"], h["variant"], h["seed"])] = run["final"]["final_val_loss"]
    out: dict[str, Any] = {}
    cells = sorted({(m, v) for _, m, v, _ in final})
    for model, variant in cells:
        seeds = sorted(s for p, m, v, s in final if (p, m, v) == ("study", model, variant)
                       and all((q, model, n, s) in final for q in PATHS for n in (variant, REFERENCE)))  # fmt: skip
        cell: dict[str, Any] = {"seeds": seeds}
        per_path = {}
        for path in PATHS:
            loss = [final[(path, model, variant, s)] for s in seeds]
            gap = [100 * (final[(path, model, variant, s)] / final[(path, model, REFERENCE, s)] - 1)
                   for s in seeds]  # fmt: skip
            per_path[path] = gap
            cell[path] = {"final_val_loss": _mean_sd(loss), "gap_pct": _mean_sd(gap)}
        moved = [b - a for a, b in zip(per_path["study"], per_path["product"], strict=True)]
        loss_moved = [100 * (final[("product", model, variant, s)]
                             / final[("study", model, variant, s)] - 1) for s in seeds]  # fmt: skip
        cell["gap_moved_pct"] = _mean_sd(moved)
        cell["loss_moved_pct"] = _mean_sd(loss_moved)
        out.setdefault(model, {})[variant] = cell
    return out


def _pm(stat: dict[str, float], sign: bool = True) -> str:
    """``+1.23 ± 0.45`` (a gap, %), or ``4.567 ± 0.089`` (a loss)."""
    if stat["n"] == 0 or math.isnan(stat["mean"]):
        return "-"
    digits = 2 if sign else 3
    return f"{stat['mean']:{'+' if sign else ''}.{digits}f} ± {stat['sd']:.{digits}f}"


def report(archive: Path, out_dir: Path) -> dict[str, Any]:
    """``summary.json`` and ``README.md`` in ``out_dir``, from the archive alone."""
    runs = read_archive(archive)
    table = gaps(runs)
    steps = sorted({r["header"]["steps"] for r in runs})
    commits = sorted({(r["header"].get("code") or {}).get("commit") or "none" for r in runs})
    codes = sorted({(r["header"].get("code") or {}).get("step_code") or "none" for r in runs})
    summary = {"steps": steps, "runs": len(runs), "commits": commits, "step_codes": codes,
               "cells": table}  # fmt: skip
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# Does the verdict carry over to the runs users make?",
        "",
        "Written by `make quality-product-path` (`pipelines/studies/product_path.py`, whose "
        "docstring says what each path is) from `runs.tar.xz` in this folder.",
        "",
        *table_lines(summary),
    ]
    (out_dir / "README.md").write_text("\n".join(lines) + "\n")
    return summary


def table_lines(summary: dict[str, Any]) -> list[str]:
    """What the runs were, the two paths, and the table of :func:`gaps` (``summary.json``)."""
    lines = [
        f"{summary['runs']} runs at {', '.join(map(str, summary['steps']))} steps, code "
        f"version {', '.join(summary['step_codes'])} (commits "
        f"{', '.join(c[:10] for c in summary['commits'])}), on one host side by side:",
        "",
        "- **study**: the verdict's path (contiguous layout, the study's schedule, one "
        "micro-batch per worker);",
        "- **product**: a user's `train.engine=simulator` run (Megatron's bucket layout and "
        "scheduler, micro-batches of 2).",
        "",
        "Each method at the lr the verdict chose at this horizon; gap: % from dense AdamS on "
        "the same path and seed, mean ± sd over seeds; moved: the product path's gap minus "
        "the study path's, paired by seed (percentage points); loss moved: % from the study "
        "path's final loss to the product path's, paired by seed.",
        "",
        "| model | method | seeds | loss, study | loss, product | loss moved | gap, study "
        "| gap, product | gap moved |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, cells in summary["cells"].items():
        for variant, c in cells.items():
            gap = ("(reference)", "(reference)", "-") if variant == REFERENCE else (
                _pm(c["study"]["gap_pct"]), _pm(c["product"]["gap_pct"]),
                _pm(c["gap_moved_pct"]))  # fmt: skip
            lines.append(
                f"| {model} | {variant} | {len(c['seeds'])} "
                f"| {_pm(c['study']['final_val_loss'], False)} "
                f"| {_pm(c['product']['final_val_loss'], False)} "
                f"| {_pm(c['loss_moved_pct'])} | {' | '.join(gap)} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="a horizon with closed lr grids")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--runs", type=Path, default=REPO / "outputs" / "product_path")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--report-only", action="store_true", help="from the committed archive")
    args = p.parse_args(argv)
    archive = args.out / "runs.tar.xz"
    if not args.report_only:
        if REFERENCE not in args.variants:
            raise SystemExit(f"--variants must include {REFERENCE}: every gap is against it")
        train(plan(args.steps, args.seeds, tuple(args.variants)), args.runs)
        pack(args.runs, archive)
    report(archive, args.out)
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
