"""A larger quality check on one CUDA GPU (run it with ``scripts/gpu_quality.sh``).

Dense AdamS, SCAPE-90 and SCAPE-99 through the quality study's simulator (``pipelines.
quality_study`` with ``quality/scale@scale=gpu``: a ~52M-parameter Llama, W=4 simulated
workers, 1,000 steps of 8,192 tokens), each at the scale's lr. Writes
``results/gpu/gpu_quality_<gpu>_<utc date>.json`` with each run's final validation loss,
its curve, its wall time, and the gaps to AdamS. Without CUDA it says so and exits 0 without
writing anything; ``--cpu-smoke`` runs the same code with a tiny model for a few steps on the
CPU, to test the script itself.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ["adams", "scape90", "scape99"]


def study_overrides(out_dir: Path, data_dir: str, *, smoke: bool) -> list[str]:
    overrides = [
        "quality/scale@scale=gpu",
        f"data_dir={data_dir}",
        f"cache_dir={out_dir / 'cache'}",
        f"out_dir={out_dir}",
        f"only_variants=[{','.join(VARIANTS)}]",
        "seeds=[0]",
        "report=false",
    ]
    if smoke:  # the same code path at toy size on the CPU
        overrides += [
            "scale.device=cpu", "scale.steps=4", "scale.warmup_steps=1", "scale.eval_interval=2",
            "scale.batch_per_worker=1", "scale.seq_length=32", "scale.val_max_sequences=4",
            "scale.models=[{name: smoke, family: llama, num_layers: 1, hidden_size: 32, "
            "num_attention_heads: 2, num_query_groups: 1, ffn_hidden_size: 64}]",
        ]  # fmt: skip
    return overrides


def collect(out_dir: Path) -> dict:
    runs = {}
    for path in sorted((out_dir / "runs").rglob("*.jsonl")):  # runs/<code version>/
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        header, final = lines[0], lines[-1]
        runs[header["variant"]] = {
            "params": header["params"],
            "final_val_loss": final["final_val_loss"],
            "diverged": final["diverged"],
            "seconds": final["seconds"],
            "curve": [(r["step"], r["val_loss"]) for r in lines[1:-1] if "val_loss" in r],
        }
    ref = runs.get("adams", {}).get("final_val_loss")
    for run in runs.values():
        run["gap_to_adams_pct"] = 100 * (run["final_val_loss"] - ref) / ref if ref else None
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--cpu-smoke", action="store_true", help="toy sizes on the CPU (tests the script)"
    )
    p.add_argument("--out-dir", default=str(ROOT / "results" / "gpu"))
    p.add_argument("--work-dir", default=str(ROOT / "outputs" / "gpu_quality"))
    p.add_argument("--data-dir", default=str(ROOT / "data" / "enwiki_sample__bytebpe1k"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpu_quality: SKIPPED - no CUDA device visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing written.")  # fmt: skip
        return 0
    from hydra import compose, initialize_config_dir

    from pipelines.quality_study import run

    work = Path(args.work_dir)
    started = time.perf_counter()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        overrides = study_overrides(work, args.data_dir, smoke=args.cpu_smoke)
        cfg = compose("quality_study", overrides=overrides)
    run(cfg)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-smoke"
    report = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu,
        "torch": torch.__version__,
        "scale": "conf/quality/scale/gpu.yaml" + (" (cpu smoke)" if args.cpu_smoke else ""),
        "runs": collect(work),
        "wall_s": time.perf_counter() - started,
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"gpu_quality_{name}_{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_quality: wrote {path} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
