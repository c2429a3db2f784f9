"""Hydra stage: the quality study. Which reading of SCAPE keeps dense-level loss at 90/99%?

    python -m pipelines.quality_study                     # every variant, seed 0, 300 steps
    python -m pipelines.quality_study scale.steps=1500 'lr_scales=[0.5,1,2]'   # a horizon, the lr grid
    python -m pipelines.quality_study quick=true          # minutes: tiny models, few steps
    python -m pipelines.quality_study only_variants=[adams,scape99] 'seeds=[0,1,2]'
    python -m pipelines.quality_study report_only=true    # only rewrite the report
    python -m pipelines.quality_study replay=true         # join older code versions' runs

Grid: models of the scale preset x variants x seeds (core variants with ``seeds``, the
ablations with ``ablation_seeds``), core runs first so that an interrupted study has the
main comparison. Each run is a W-worker simulation of a Megatron GPTModel
(:mod:`pipelines.studies.quality_run`); finished runs are skipped on a rerun, and so are
runs a replay-joined code version finished. Several processes may run one plan together
(``make quality-queue`` starts two): each claims a run before running it
(:mod:`pipelines.studies.claims`). The report
(:mod:`pipelines.studies.quality_report`) is written from every finished run in ``out_dir``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pipelines.stage import one_line_errors, register_schema
from pipelines.studies.claims import claim, wait_for_others
from pipelines.studies.protocol import code_classes, code_version, load_equivalences
from pipelines.studies.quality_config import QualityStudyConfig, RunSpec
from pipelines.studies.run_store import run_text

__all__ = ["plan_runs", "resolve", "run"]

REPO = Path(__file__).resolve().parents[1]


register_schema("quality_study", QualityStudyConfig)


def resolve(cfg: QualityStudyConfig | DictConfig) -> QualityStudyConfig:
    """The typed config, with ``quick=true`` folded in (quick scale, variants, seeds, out_dir)."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    assert isinstance(cfg, QualityStudyConfig)
    if not cfg.quick:
        return cfg
    unknown = [v for v in cfg.quick_variants if v not in cfg.variants]
    if unknown:
        raise ValueError(f"quick_variants names unknown variants: {unknown}")
    return dataclasses.replace(
        cfg,
        scale=cfg.quick_scale,
        variants={k: v for k, v in cfg.variants.items() if k in cfg.quick_variants},
        seeds=list(cfg.quick_seeds),
        ablation_seeds=list(cfg.quick_seeds),
        out_dir=cfg.quick_out_dir,
    )


def plan_runs(
    cfg: QualityStudyConfig, lr_of: Callable[[str, str], float | None] | None = None
) -> list[RunSpec]:
    """Core variants for every seed first (seed by seed), then the ablations. A variant with
    ``lr_of`` runs at ``lr_of(model, that variant)`` (the lr the study chose for it), and not
    at all while that is None (its grid not yet closed)."""
    models = [m for m in cfg.scale.models if not cfg.only_models or m.name in cfg.only_models]
    variants = {
        k: v for k, v in cfg.variants.items() if not cfg.only_variants or k in cfg.only_variants
    }
    plan = []
    for core, seeds in ((True, cfg.seeds), (False, cfg.ablation_seeds)):
        for seed in seeds:
            for model in models:
                for name, variant in variants.items():
                    if variant.core != core:
                        continue
                    lrs = list(cfg.lr_scales)
                    if variant.lr_of:
                        chosen = lr_of(model.name, variant.lr_of) if lr_of else None
                        lrs = [] if chosen is None else [chosen]
                    for lr_scale in lrs:
                        plan.append(
                            RunSpec(model, name, variant, seed, cfg.scale, cfg.data_dir, lr_scale)
                        )
    return plan


def grid_extensions(
    cfg: QualityStudyConfig, plan: list[RunSpec], out_dir: Path, code: str
) -> list[RunSpec]:
    """The runs that close the planned core cells' grids one step further: where a cell's
    chosen lr (:func:`~pipelines.studies.protocol.choose_lr`, over its seeds, at this
    horizon, this code version's runs) is the grid's lowest or highest point, the point half
    or twice as large, on every seed of the cell."""
    from pipelines.studies.run_index import RunIndex

    index = RunIndex.load(out_dir, code)
    cells = {(s.model.name, s.variant_name): s for s in plan if s.variant.core}
    more = []
    for (model, variant), spec in cells.items():
        choice = index.lr_choice(model, variant, cfg.scale.steps)
        if choice is None or choice.closed:
            continue
        lr = choice.lr / 2 if choice.lr == choice.grid[0] else choice.lr * 2
        more += [dataclasses.replace(spec, seed=seed, lr_scale=lr) for seed in choice.seeds]
    return more


def study_notes(cfg: QualityStudyConfig) -> str:
    s = cfg.scale
    tokens = s.world_size * s.batch_per_worker * s.seq_length
    return (
        f"Scale `{s.name}`: W={s.world_size} simulated workers x {s.batch_per_worker} sequences x "
        f"{s.seq_length} tokens per step ({tokens:,} tokens), horizons as run ({s.steps} by "
        f"default); lr {s.lr:g} -> {s.min_lr:g} times the run's lr scale (warm-up "
        f"{s.warmup_steps}, cosine), wd {s.weight_decay}, betas ({s.beta1}, {s.beta2}), clip "
        f"{s.clip_grad} for every arm: the dense references clip their reduced gradient, "
        f"SCAPE its update q, by Megatron's rule (runs made before commit stamping: SCAPE "
        f"clipped nothing; the local-moment readings still clip nothing); data "
        f"`{cfg.data_dir}`. Final val loss: the whole validation split after the last step. "
        f"Gap: per seed against the AdamS run with the same model, horizon and seed (same "
        f"data order and initial weights), each at its own lr: the grid point with the lowest "
        f"mean final loss over all the cell's seeds at the horizon shown; then mean and std "
        f"over seeds."
    )


def replay_others(
    cfg: QualityStudyConfig, out_dir: Path, code: dict[str, Any], train: Callable[..., Any]
) -> None:
    """Replay, with this code, one run per (model, variant) of every other stamped code version
    under ``out_dir/runs`` that no replay has joined to it yet (``only_models`` /
    ``only_variants`` narrow the set); record the two versions as one where every replay gives
    the same bits, and say where the first one differed otherwise."""
    from pipelines.studies.protocol import UNSTAMPED, record_equivalence
    from pipelines.studies.replay import differences, replay_set, spec_of
    from pipelines.studies.run_index import load_runs, read_run, run_key

    runs_root, current = out_dir / "runs", str(code["step_code"])
    runs = [r for r in load_runs(runs_root)
            if (not cfg.only_models or r.model in cfg.only_models)
            and (not cfg.only_variants or r.variant in cfg.only_variants)]  # fmt: skip

    def joined() -> frozenset[str]:
        return code_classes(load_equivalences(runs_root)).get(current, frozenset({current}))

    # the cheapest replays first: one success joins every version already joined to that one
    shortest = {c: min(run_key(r).steps for r in runs if r.step_code == c)
                for c in {r.step_code for r in runs} - joined() - {UNSTAMPED}}  # fmt: skip
    others = sorted(shortest, key=lambda c: (shortest[c], c))
    if not others:
        print(f"replay: no code version to compare with `{current}`", flush=True)
    for other in others:
        if other in joined():
            print(f"replay: `{other}` is joined to `{current}` through another replay", flush=True)
            continue
        stored = replay_set(runs, other)
        into = Path(cfg.replay_dir) / current
        found = []
        for i, run in enumerate(stored, 1):
            spec = spec_of(run, cfg.data_dir)
            train(spec, f"replaying `{other}` with `{current}`: {i}/{len(stored)}", into)
            replayed = read_run(into / f"{spec.run_id}.jsonl")
            assert replayed is not None
            diff = differences(run, replayed)
            print(f"  {spec.run_id}: {'same bits' if diff is None else diff}", flush=True)
            found += [f"{spec.run_id}: {diff}"] if diff else []
        if found:
            print(f"replay: `{current}` does NOT compute what `{other}` did ({len(found)} of "
                  f"{len(stored)} runs differ); its runs stay apart", flush=True)  # fmt: skip
            continue
        record_equivalence(runs_root, {
            "code": current, "same_as": other, "runs": [r.header["run_id"] for r in stored],
            "commit": code["commit"], "dirty": code["dirty"],
        })  # fmt: skip
        print(f"replay: `{current}` computes what `{other}` did ({len(stored)} runs, same "
              f"bits); recorded in {runs_root / 'equivalent.json'}", flush=True)  # fmt: skip


def run(cfg: QualityStudyConfig | DictConfig) -> list:
    """Run (or skip, when finished) every planned run, then write the report."""
    import torch

    from pipelines.studies.quality_report import write_report
    from pipelines.studies.quality_run import completed_log, init_megatron_single_process
    from pipelines.studies.study_trainer import StudyTrainer

    cfg = resolve(cfg)
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its dataset INFO lines drown ours
    torch.set_num_threads(1)  # the machine is shared; one core per study process
    init_megatron_single_process()
    out_dir = Path(cfg.out_dir)
    code = code_version(REPO)
    runs_dir = out_dir / "runs" / str(code["step_code"])

    def chosen_lr(model: str, variant: str) -> float | None:
        from pipelines.studies.run_index import RunIndex

        choice = RunIndex.load(out_dir, str(code["step_code"])).lr_choice(
            model, variant, cfg.scale.steps
        )
        if choice is None or not choice.closed:
            print(f"{model} {variant} at {cfg.scale.steps} steps: no closed lr grid yet, so "
                  f"the variants run at its lr wait", flush=True)  # fmt: skip
            return None
        return choice.lr

    plan = [] if cfg.report_only or cfg.replay else plan_runs(cfg, chosen_lr)
    trainer = StudyTrainer(code, cache_dir=cfg.cache_dir, checkpoint_s=cfg.checkpoint_seconds,
                           final_test=cfg.final_test)  # fmt: skip

    def finished(spec: RunSpec) -> dict[str, Any] | None:
        """The run's final record when this code version, or one a replay joined to it, has
        finished it with these settings."""
        current = str(code["step_code"])
        joined = code_classes(load_equivalences(out_dir / "runs")).get(current, {current})
        for version in sorted(joined, key=lambda c: c != current):
            text = run_text(out_dir / "runs", f"{version}/{spec.run_id}.jsonl")  # or archived
            if done := completed_log(text, spec.fingerprint()):
                return done
        return None

    def train(spec: RunSpec, label: str, into: Path = runs_dir) -> dict[str, Any]:
        if into == runs_dir and (done := finished(spec)):
            return done
        start = time.perf_counter()
        final = trainer(spec, into)
        print(
            f"[{label}] {spec.run_id}: val {final['final_val_loss']:.4f}"
            f"{' DIVERGED' if final['diverged'] else ''} ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )
        return final

    if cfg.replay:
        replay_others(cfg, out_dir, code, train)

    def train_claimed(specs: list[RunSpec], label: str) -> None:
        """Every run of ``specs`` no other worker holds; then wait for the ones they do."""
        for i, spec in enumerate(specs, 1):
            with claim(runs_dir, spec.run_id) as mine:
                if mine:
                    train(spec, f"{label}{i}/{len(specs)}")
        wait_for_others(runs_dir, [s.run_id for s in specs])

    train_claimed(plan, "")
    for extension in range(1, cfg.close_grids + 1):
        more = grid_extensions(cfg, plan, out_dir, str(code["step_code"]))
        if not more:
            break
        train_claimed(more, f"closing grids, round {extension}: ")
        plan += more
    if not cfg.report:
        return []
    from scape.megatron.models import SHAPES, count_params

    labels = {k: v.label or k for k, v in cfg.variants.items()}
    paper = SHAPES["llama-1.8b"]
    committed = out_dir.resolve() == (REPO / "results" / "quality").resolve()
    index = write_report(
        out_dir, cfg.variants, labels, study_notes(cfg), finalists=cfg.finalists,
        cost_shape=("Llama-1.8B", count_params(paper), 32), overview=cfg.overview,
        # the project README's verdict is the early-gap study's (pipelines/studies/early_gap.py:
        # held-out data, every gap on test); this study's stays in its own README
        paper_sizes={name: count_params(SHAPES[key])
                     for name, key in (("Llama-500M", "llama-500m"), ("Llama-1.8B", "llama-1.8b"))},
        data_dir=cfg.data_dir, gpu_repo=REPO if committed else None,
    )  # fmt: skip
    print((out_dir / "summary.md").read_text(encoding="utf-8"))
    return list(index.runs)


@hydra.main(config_path="../conf", config_name="quality_study", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from data_prep.errors import DataPrepError

    with one_line_errors(DataPrepError, status=1, hint="; prepare the data first (make prepare)"):
        run(cfg)


if __name__ == "__main__":
    main()
