"""The verdict at GPU scale, a few runs per lent GPU (run it with ``scripts/gpu_quality.sh``).

Runs the next runs of the GPU queue (:mod:`pipelines.studies.gpu_queue`: the ~52M Llama and
~127M GPT of ``conf/quality/scale/gpu.yaml``, dense AdamS and AdamW, SCAPE-90 and SCAPE-99,
a 3-point lr grid placed by the recipe, 2 seeds, 1,000 steps each) that fit in
``--budget-s``, one after another through the quality study's simulator, and writes each
finished run's record at once to ``--out-dir/<code version>/<run id>.jsonl``, so a window cut
short keeps what finished. Runs already recorded under ``--records`` (committed:
``results/quality/gpu/runs``) at this code version are skipped: rerunning resumes the queue.
A summary of the session (GPU, versions, runs, seconds, the queue's progress) goes to
``--summary-dir``.

Matmuls run in TF32 on the GPU (what a GPU user trains with rather than strict fp32, and
the same for every method); the summary records it. Without CUDA it says SKIPPED and writes
nothing; ``--dry-run`` prints what would run; ``--cpu-smoke`` runs the same path with toy
models for a few steps on the CPU, to test the script itself.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.studies.gpu_queue import (  # noqa: E402
    GPU_DATA,
    GPU_RECORDS,
    approx_params,
    done_runs,
    estimate_seconds,
    load_recipe,
    measured_seconds_per_step,
    next_runs,
    plan,
)

SMOKE = [  # the same code path at toy size on the CPU
    "scale.device=cpu", "scale.steps=4", "scale.warmup_steps=1", "scale.eval_interval=2",
    "scale.batch_per_worker=1", "scale.seq_length=32", "scale.val_max_sequences=4",
    "scale.models=[{name: smoke_llama, family: llama, num_layers: 1, hidden_size: 32, "
    "num_attention_heads: 2, num_query_groups: 1, ffn_hidden_size: 64}, {name: smoke_gpt, "
    "family: gpt, num_layers: 1, hidden_size: 32, num_attention_heads: 2, ffn_hidden_size: 64}]",
]  # fmt: skip


def compose_study(work: Path, data_dir: Path, extra: list[str]):
    from hydra import compose, initialize_config_dir

    from pipelines.quality_study import resolve

    overrides = ["quality/scale@scale=gpu", f"data_dir={data_dir}", f"out_dir={work}",
                 f"cache_dir={work / 'cache'}", "report=false", "close_grids=0", *extra]  # fmt: skip
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return resolve(compose("quality_study", overrides=overrides)), overrides


def run_one(queued, overrides: list[str]) -> None:
    """One run through the quality study (its own resumable run, in ``out_dir``)."""
    from hydra import compose, initialize_config_dir

    from pipelines.quality_study import run

    only = [f"only_models=[{queued.model}]", f"only_variants=[{queued.variant}]",
            f"seeds=[{queued.spec.seed}]", f"lr_scales=[{queued.spec.lr_scale}]"]  # fmt: skip
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        run(compose("quality_study", overrides=[*overrides, *only]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="wall seconds of runs to start in this window (default 480: ~8 minutes)",
    )
    p.add_argument("--max-runs", type=int, default=None, help="at most this many runs")
    p.add_argument(
        "--records",
        default=str(ROOT / GPU_RECORDS / "runs"),
        help="finished records so far (what the queue skips)",
    )
    p.add_argument("--out-dir", default=None, help="where new records go (default: --records)")
    p.add_argument("--summary-dir", default=str(ROOT / "results" / "gpu"))
    p.add_argument("--work-dir", default=str(ROOT / "outputs" / "gpu_quality"))
    p.add_argument("--data-dir", default=str(ROOT / GPU_DATA))
    p.add_argument("--recipe", default=str(ROOT / "results" / "quality" / "recipe.json"))
    p.add_argument("--dry-run", action="store_true", help="print the queue and what would run")
    p.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU")
    args = p.parse_args(argv)  # fmt: skip
    cuda = torch.cuda.is_available()
    if not cuda and not (args.cpu_smoke or args.dry_run):
        print("gpu_quality: SKIPPED - no CUDA device visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing written.")  # fmt: skip
        return 0
    from pipelines.studies.protocol import code_version

    started = time.perf_counter()
    records, work = Path(args.records), Path(args.work_dir)
    out = Path(args.out_dir) if args.out_dir else records
    data = Path(args.data_dir)
    cfg, overrides = compose_study(work, data, SMOKE if args.cpu_smoke else [])
    queue = plan(
        cfg.scale.models, cfg.variants, cfg.scale, cfg.data_dir, load_recipe(Path(args.recipe))
    )
    code = code_version(ROOT)
    done = done_runs(records, str(code["step_code"]), queue)
    measured = measured_seconds_per_step(records)
    params = {m.name: approx_params(m) for m in cfg.scale.models}
    estimates = {q.run_id: estimate_seconds(q, params[q.model], measured) for q in queue}
    chosen = next_runs(queue, done, estimates, args.budget_s)[: args.max_runs]
    print(f"gpu_quality: code {code['step_code']}: {len(done)} of {len(queue)} runs done; this "
          f"window ({args.budget_s:.0f} s) takes {len(chosen)}:", flush=True)  # fmt: skip
    for q in chosen:
        print(f"  {q.run_id} (~{estimates[q.run_id]:.0f} s)", flush=True)
    if args.dry_run:
        return 0
    if not (data / "metadata.json").is_file():
        raise SystemExit(
            f"gpu_quality: no prepared corpus at {data}: run `make gpu-corpus` where Debian's "
            "package registry is reachable, and carry data/debian_docs__bytebpe1k"
        )
    if cuda:  # TF32 matmuls: see the module docstring
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    finished = []
    for q in chosen:
        elapsed = time.perf_counter() - started
        if elapsed + estimates[q.run_id] > args.budget_s:
            print(f"gpu_quality: {q.run_id} (~{estimates[q.run_id]:.0f} s) no longer fits "
                  f"({elapsed:.0f} s gone); stopping", flush=True)  # fmt: skip
            break
        t0 = time.perf_counter()
        run_one(q, overrides)
        record = work / "runs" / str(code["step_code"]) / f"{q.run_id}.jsonl"
        target = out / str(code["step_code"]) / record.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, target)  # at once: a cut window keeps it
        finished.append({"run_id": q.run_id, "seconds": round(time.perf_counter() - t0, 1),
                         "estimate_s": round(estimates[q.run_id], 1)})  # fmt: skip
    gpu = torch.cuda.get_device_name() if cuda else "cpu-smoke"
    summary = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu, "torch": torch.__version__, "code": code, "tf32": cuda,
        "data_dir": data.name, "budget_s": args.budget_s, "finished": finished,
        "queue": {"runs": len(queue), "done_before": len(done),
                  "done_after": len(done) + len(finished)},
        "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    summary_dir = Path(args.summary_dir)
    summary_dir.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = summary_dir / f"gpu_queue_{name}_{stamp}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"gpu_quality: {len(finished)} runs finished; wrote {path} ({summary['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
