"""`python -m benchmarks.ab_step A B`: the SCAPE adapter's CPU step in two source trees, side by side.

For "no regression" checks of a change to the step: each round times, in one tree then the
other, the median of 20 Megatron train steps (after 3 untimed) of SCAPE on 2 gloo ranks (a
~5M-parameter Llama, SCAPE-99 with the configs' bf16 wire, one thread per rank), each tree's
code imported from its own root (a git worktree of the older commit, say). Rounds alternate
the order; the 1-min load is recorded before each. Refuses to start beside a study, the tests
or another benchmark (the quiet-machine protocol). Prints one JSON line per timing and the
median per tree; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.quiet import load_average, require_quiet

STEPS, WARMUP = 23, 3


def _rank(rank: int, world_size: int) -> float:
    sys.modules.setdefault("wandb", None)  # megatron imports it when it can; unused here
    import torch

    from scape.config import ScapeConfig
    from scape.megatron.dense import OptimizerSpec, init_megatron, wrap_ddp
    from scape.megatron.models import SHAPES, build_gpt_model
    from scape.megatron.optimizer import build_scape_optimizer
    from scape.megatron.train import train_step

    torch.set_num_threads(1)
    init_megatron(0)
    shape = SHAPES["small-llama"]
    config, model = build_gpt_model(shape)
    ddp = wrap_ddp(config, model, bucket_size=1_000_000)
    cfg = ScapeConfig.for_sparsity(0.99, value_dtype="bfloat16")
    opt = build_scape_optimizer(ddp, OptimizerSpec(lr=1e-4), cfg, check_every=0)
    tokens = torch.randint(0, shape.vocab_size, (2, shape.seq_length + 1),
                           generator=torch.Generator().manual_seed(rank))  # fmt: skip
    times = [train_step(ddp, opt, (tokens[:, :-1], tokens[:, 1:])).seconds for _ in range(STEPS)]
    return statistics.median(times[WARMUP:])


def _time_tree(tree: Path) -> float:
    """The median step of the code in ``tree``, in a fresh interpreter rooted there."""
    code = ("import json, sys; from scape.spawn import run_distributed; "
            "from benchmarks.ab_step import _rank; "
            "print(json.dumps(run_distributed(_rank, 2, timeout_s=600)[0]))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    ab = Path(__file__).resolve()
    if not (tree / "benchmarks" / "ab_step.py").is_file():  # an older tree: use this file's _rank
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{ab.parents[1]}"
        code = code.replace("from benchmarks.ab_step import _rank", "from ab_step import _rank")
        env["PYTHONPATH"] += f"{os.pathsep}{ab.parent}"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (A, B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--allow-busy", action="store_true")
    args = parser.parse_args(argv)
    require_quiet("ab_step", args.allow_busy)
    times: dict[str, list[float]] = {str(t): [] for t in args.trees}
    for r in range(args.rounds):
        for tree in args.trees if r % 2 == 0 else args.trees[::-1]:
            load = load_average()
            seconds = _time_tree(tree.resolve())
            times[str(tree)].append(seconds)
            print(json.dumps({"round": r, "tree": str(tree), "median_step_s": seconds,
                              "load_before": load}), flush=True)  # fmt: skip
    print(json.dumps({tree: statistics.median(ts) for tree, ts in times.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
