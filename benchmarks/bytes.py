"""`make bench-bytes`: bytes on the wire per rank per step, by kind, for every method.

``measured``: W gloo ranks on loopback step a small Llama through Megatron's train step
(:mod:`benchmarks.harness.bytecount`), SCAPE's counts checked against
:func:`scape.comm.step_bytes_per_rank`; ``paper_scale``: the same formulas for the paper's
models at W=32 (:mod:`benchmarks.harness.paper`). Nothing is timed.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, paper, quiet
from benchmarks.harness.bytecount import bytecount_worker
from benchmarks.harness.launch import launch_ranks
from scape.comm import step_bytes_per_rank
from scape.config import ScapeConfig

__all__ = [
    "MEASURED_METHODS",
    "RUN_STEPS",
    "paper_scale_bytes",
    "shipped_run_config",
    "summarize_measured",
]

MODEL = {"layers": 2, "hidden": 256, "heads": 4, "ffn": 704, "seq": 32, "batch": 1}
BUCKET_SIZE = 400_000  # elements: several buckets, so per-bucket flags show in the counts
MEASURED_METHODS = [
    {"name": "dense-adamw", "optimizer": "adamw"},
    {"name": "dense-adams"},
    *[
        {"name": f"scape-{label}{suffix}", "optimizer": "scape", "sparsity": s,
         "value_dtype": dtype}
        for suffix, dtype in (("", "float32"), ("-bf16", "bfloat16"))
        for label, s in (("90", 0.9), ("99", 0.99))
    ],
]  # fmt: skip
VALUE_NBYTES = {"float32": 4, "bfloat16": 2}


def scape_formula(method: dict[str, Any], shard_sizes: list[int], world: int) -> dict[str, float]:
    """What SCAPE's counter should book in a sparse step for this run's buckets."""
    selected = paper.selected_per_shard(shard_sizes, method["sparsity"])
    out = step_bytes_per_rank(selected, world, VALUE_NBYTES[method["value_dtype"]], masks=True)
    return {k: v for k, v in out.items() if v}


def summarize_measured(results: list[dict[str, Any]],
                       methods: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Median bytes per rank per step by kind (rank 0's), ratios, SCAPE's formula and check."""
    world, r0 = len(results), results[0]
    out: dict[str, Any] = {}
    for m in methods:
        rows = [r for r in r0["steps"] if r["method"] == m["name"] and r["measured"]]
        kinds = sorted({k for r in rows for k in r["bytes"]})
        entry: dict[str, Any] = {
            "bytes_per_rank": {k: statistics.median(r["bytes"].get(k, 0.0) for r in rows)
                               for k in kinds}}  # fmt: skip
        if m.get("optimizer") == "scape":
            formula = scape_formula(m, r0["shard_sizes"], world)
            entry["formula"] = formula
            entry["matches_formula"] = set(formula) == set(entry["bytes_per_rank"]) and all(
                math.isclose(entry["bytes_per_rank"][k], v, rel_tol=1e-12)
                for k, v in formula.items()
            )
        out[m["name"]] = entry
    dense = out["dense-adams"]["bytes_per_rank"]
    dense_total = dense.get("grad_values", 0.0) + dense.get("param_values", 0.0)
    for entry in out.values():
        entry.update(paper.totals(entry["bytes_per_rank"], dense_total))
    return {"world_size": world, "n_params": r0["n_params"], "padded": r0["padded"],
            "shard_sizes": r0["shard_sizes"], "methods": out}  # fmt: skip


# The run the shipped SCAPE-99's mean is taken over (its ramp is a share of the run, so the
# mean barely moves with the length: 1,000 steps and 100,000 differ in the third digit)
RUN_STEPS = 10_000


def shipped_run_config(name: str = "scape99") -> tuple[ScapeConfig, int]:
    """The shipped config's SCAPE settings for a run of :data:`RUN_STEPS`, and its values'
    bytes on the wire."""
    from pipelines.training.config import compose, scape_config

    o = compose([f"optimizer={name}", f"train.train_steps={RUN_STEPS}"]).optimizer
    return scape_config(o, RUN_STEPS), VALUE_NBYTES[o.scape.value_dtype]


def paper_scale_bytes(n_params: int, world_size: int) -> dict[str, Any]:
    """Per-rank bytes per step of dense ZeRO-1 bf16 and SCAPE-90/99 (bf16, fp32 values) at
    scale, each in its steady sparse step; and the shipped SCAPE-99's mean over a run, which
    counts its dense first step and its density ramp (``scape-99-shipped-run``)."""
    dense = paper.dense_bytes(n_params, world_size)
    entries = {"dense-adams": dense}
    for suffix, nbytes in (("-bf16", 2), ("", 4)):
        for label, s in (("90", 0.9), ("99", 0.99)):
            entries[f"scape-{label}{suffix}"] = paper.scape_bytes(n_params, world_size, s, nbytes)
    cfg, nbytes = shipped_run_config()
    entries["scape-99-shipped-run"] = paper.scape_run_bytes(n_params, world_size, cfg,
                                                            RUN_STEPS, nbytes)  # fmt: skip
    dense_total = dense["grad_values"] + dense["param_values"]
    return {"n_params": n_params, "world_size": world_size,
            "methods": {n: {"bytes_per_rank": e, **paper.totals(e, dense_total)} for n, e in entries.items()}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, Path("results/bench/bytes.json"))
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="measured steps per method")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out (SCAPE's dense one)")
    args = parser.parse_args(argv)
    cli.start("bench-bytes", args)
    load_before = quiet.load_average()
    spec = {"model": MODEL, "bucket_size": BUCKET_SIZE, "methods": MEASURED_METHODS,
            "warmup": args.warmup, "rounds": args.rounds}  # fmt: skip
    print(f"== bytes: {args.world_size} gloo ranks on loopback, Megatron's train step, "
          f"{len(MEASURED_METHODS)} methods", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="scape-bytes-") as tmp:
        results = launch_ranks(bytecount_worker, spec, Path(tmp), world_size=args.world_size,
                               timeout_s=1800)  # fmt: skip
    measured = summarize_measured(results, MEASURED_METHODS)
    from scape.megatron.models import SHAPES, count_params

    report: dict[str, Any] = {
        "model": MODEL, "bucket_size": BUCKET_SIZE, "measured": measured,
        "paper_scale": {m: paper_scale_bytes(count_params(SHAPES[m]), 32) for m in paper.PAPER_MODELS},
        # Byte counts do not depend on load; recorded as every benchmark records it.
        "quiet": {"load_before": load_before, "load_after": quiet.load_average(),
                  "note": "counts only: not re-run under load"},
    }  # fmt: skip
    for name, m in measured["methods"].items():
        check = {True: "  = formula", False: "  != formula"}.get(m.get("matches_formula"), "")
        print(f"  {name:14s} {m['total'] / 1e3:9.1f} kB/rank/step  dense/this "
              f"{m['dense_over_this']:6.1f}  this/values {m['this_over_value_limit']:.2f}{check}")  # fmt: skip
    cli.write_json(args.out, report)
    return 0 if all(m.get("matches_formula", True) for m in measured["methods"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
