"""`make reproduce-table`: prepare -> pretrain every optimizer -> evaluate -> tables.

    python -m pipelines.reproduce                              # tiny, offline, 2 local CPU ranks
    python -m pipelines.reproduce --scale paper --cluster vista [--dry-run]

At ``--scale tiny`` everything runs here (``conf/scale/tiny_table.yaml``): the embedded
corpus with its 1,024-entry byte-level BPE, a tiny GPT (GPT-345M's experiment) and a tiny
Llama (Llama-500M's), each with AdamW, AdamS, SCAPE-90 and SCAPE-99, then lm-eval on local
offline tasks, then the tables and each experiment's W&B report (offline JSON unless
``WANDB_API_KEY`` is set). Finished runs are not redone (a
pretrain run resumes from its checkpoint; a finished one returns at once); a run made with
settings that have changed since (a config updated by a pull) is moved to
``<experiment>/.superseded/<run>-<time>`` and trained again.

At ``--scale paper`` it submits every paper experiment's sweep to Slurm with submitit
(``--dry-run`` writes the sbatch scripts and resolved configs instead) and prints the
commands that evaluate and tabulate once the jobs are done.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from data_prep.errors import DataPrepError
from data_prep.progress import quiet_bars_without_terminal
from eval.errors import EvalError
from pipelines.training.config import ConfigError, compose

TINY_EXPERIMENTS = ["gpt345m_owt_quality", "llama500m_slimpj_quality"]
VAL_WINDOWS = 1024  # validation windows the tiny table's loss is read over (_evaluate)
# conf/scale/ config of each --scale: the tiny table has its own (conf/scale/tiny.yaml is the
# peers study's and the benchmarks' setting)
SCALE_CONFIGS = {"tiny": "tiny_table", "paper": "paper"}
PAPER_EXPERIMENTS = [
    "gpt345m_owt_quality",
    "llama500m_slimpj_quality",
    "llama500m_wallclock",
    "llama1p8b_step",
]


def _banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _prepare(cfg) -> None:
    from data_prep.config import PrepareConfig
    from pipelines.prepare import run as prepare_run

    result = prepare_run(
        PrepareConfig(data=cfg.data, tokenizer=cfg.tokenizer, output_root=cfg.data_root)
    )
    print(result.summary(), flush=True)


def _evaluate(run_dir: Path) -> dict:
    from eval.config import EvaluateConfig
    from pipelines.evaluate import run as evaluate_run

    # 200 examples per local task and 1,024 evenly spaced windows of the validation split
    # (131k tokens of debian_docs_large's 1.36M; every window: ~1.5 min a run on 2 cores) keep
    # the tiny reproduction inside its time budget.
    return evaluate_run(EvaluateConfig(run_dir=str(run_dir), tasks_examples=200,
                                       val_max_windows=VAL_WINDOWS, progress=False))  # fmt: skip


def reproduce(
    scale: str,
    cluster: str,
    dry_run: bool,
    experiments: list[str],
    output_root: str,
    tables_dir: str,
    overrides: list[str],
) -> None:
    from pipelines.pretrain import run as pretrain_run
    from pipelines.tables import TablesConfig, report_lines
    from pipelines.tables import run as tables_run
    from pipelines.training.runs import holds_other_run, run_dir_of, set_aside

    start = time.perf_counter()
    base = [f"scale={SCALE_CONFIGS[scale]}", f"output_root={output_root}", *overrides]
    if cluster != "local" or scale == "paper":
        base.append(f"cluster={cluster}")
    if dry_run:
        base.append("dry_run=true")
    configs = []
    for experiment in experiments:
        sweep = compose([f"experiment={experiment}", *base]).sweep
        configs += [
            compose([f"experiment={experiment}", f"optimizer={name}", *base]) for name in sweep
        ]
    local = all(c.cluster.launcher == "local" for c in configs)
    if local:
        _banner("1/4 prepare the data (offline default corpus and tokenizer)")
        seen = set()
        for cfg in configs:
            key = (cfg.data.name, cfg.tokenizer.name)
            if key not in seen:
                seen.add(key)
                _prepare(cfg)
    _banner(f"2/4 pretrain {len(configs)} runs ({', '.join(experiments)})")
    run_dirs = [run_dir_of(cfg) for cfg in configs]
    if not local:
        from pipelines.training.slurm import submit_sweep

        for experiment in experiments:  # one job array per experiment
            mine = [i for i, c in enumerate(configs) if c.experiment == experiment]
            for i, result in zip(
                mine,
                submit_sweep([configs[i] for i in mine], [run_dirs[i] for i in mine]),
                strict=True,
            ):
                print(
                    f"[{i + 1}/{len(configs)}] {experiment}: {configs[i].optimizer.label} -> {json.dumps(result)}",
                    flush=True,
                )
    for i, cfg in enumerate(configs if local else [], 1):
        print(
            f"[{i}/{len(configs)}] {cfg.experiment}: {cfg.model.name} with {cfg.optimizer.label} -> {run_dirs[i - 1]}",
            flush=True,
        )
        if holds_other_run(cfg, run_dirs[i - 1]):  # its settings changed since (a new config)
            moved = set_aside(run_dirs[i - 1])
            print(f"    its settings changed since that run: moved it to {moved} (see its "
                  "config.yaml) and training again", flush=True)  # fmt: skip
        result = pretrain_run(cfg)
        print(
            f"    {json.dumps({k: v for k, v in result.items() if k in ('status', 'step', 'final_val_loss')})}",
            flush=True,
        )
    if not local:
        _banner("submitted; when the jobs have finished, evaluate and tabulate with:")
        for run_dir in run_dirs:
            print(f"  python -m pipelines.evaluate run_dir={run_dir} eval_tasks=paper")
        print(
            f"  python -m pipelines.tables output_root={output_root} out_dir={tables_dir} "
            "wandb_report=true"
        )
        homes = sorted({c.cluster.hf_home for c in configs if c.cluster.hf_home})
        if homes:  # the jobs read Hugging Face data offline (conf/cluster/<cluster>.yaml)
            print(
                f"The jobs read the Hugging Face cache {', '.join(homes)} offline; fill it first "
                "on a login node with `make prefetch` (python -m pipelines.prefetch)."
            )
        return
    _banner("3/4 evaluate (validation perplexity and offline lm-eval tasks)")
    for run_dir in run_dirs:
        print(f"  {run_dir}", flush=True)
        _evaluate(run_dir)
    _banner("4/4 tables")
    out = tables_run(
        TablesConfig(
            output_root=output_root, experiments=experiments, out_dir=tables_dir, wandb_report=True
        )
    )
    print(out["quality"])
    print(out["efficiency"])
    for line in report_lines(out["wandb_reports"]):
        print(line)
    minutes = (time.perf_counter() - start) / 60
    print(
        f"done in {minutes:.1f} min. Tables and loss curves: {tables_dir}/ ; runs: {output_root}/",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    quiet_bars_without_terminal()
    parser = argparse.ArgumentParser(
        description="Reproduce the paper's tables (tiny here, or paper scale on Slurm)."
    )
    parser.add_argument("--scale", choices=["tiny", "paper"], default="tiny")
    parser.add_argument("--cluster", default="local", help="a conf/cluster/ name (local, vista)")
    parser.add_argument(
        "--dry-run", action="store_true", help="Slurm: write sbatch scripts, submit nothing"
    )
    parser.add_argument(
        "--experiments", default=None, help="comma-separated conf/experiment/ names"
    )
    parser.add_argument("--output-root", default="runs")
    parser.add_argument("--tables-dir", default="results/tables")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="extra Hydra overrides for every run, e.g. train.train_steps=50",
    )
    args = parser.parse_args(argv)
    experiments = (
        args.experiments.split(",")
        if args.experiments
        else (TINY_EXPERIMENTS if args.scale == "tiny" else PAPER_EXPERIMENTS)
    )
    try:
        reproduce(
            args.scale,
            args.cluster,
            args.dry_run,
            experiments,
            args.output_root,
            args.tables_dir,
            args.overrides,
        )
    except (ConfigError, DataPrepError, EvalError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
