"""`make bench-floor-parts`: where each method's compute-only step goes, part by part.

    python -m benchmarks.floor_parts                      # 2 ranks: dense, SCAPE-90, SCAPE-99
    python -m benchmarks.floor_parts --world 4 --methods 'scape-*'

The sweep's model and methods (:mod:`benchmarks.megatron_step`), each in a floor launch of
its own (PyTorch's fake process group: no transfer, no wait for another rank), with the
measured steps under ``torch.profiler``. SCAPE's named spans (``record_function`` in
:mod:`scape.megatron`) give its parts per step: ``scape.pack`` (candidate moment and packing,
during backward), ``scape.commit`` (the moment minus what was sent), ``scape.update``
(decode and update every entry) and ``scape.select`` (the owner's masks for the next step);
forward and backward are timed apart by the floor launch. The profiler records every op, so
steps under it are slower than the sweep's floors; the parts are for proportions.
One quiet-protocol round; writes ``results/bench/floor_parts.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import quiet
from benchmarks.launch import launch_ranks
from benchmarks.megatron_step import ROOT, methods_for, prepare_data, summarize_round

__all__ = ["PARTS", "main", "measure"]

PARTS = ("scape.pack", "scape.commit", "scape.update", "scape.select")


def measure(methods: list[dict], world: int, steps: int, warmup: int, tmp: Path,
            timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """One floor launch per method under the profiler: per method the step (median at the
    slowest rank), forward and backward, and each part's seconds per step (ranks' mean)."""
    out: dict[str, Any] = {}
    for m in methods:
        spec = {"mode": "floor", "methods": [{"name": m["name"], "overrides": m["overrides"]}],
                "warmup": warmup, "steps": steps, "profile_parts": True,
                "cache_dir": str(tmp / "dataset_cache"), "timeout_s": timeout_s}  # fmt: skip
        results = launch_ranks("benchmarks.step_rank", spec, tmp / m["name"], world_size=world,
                               timeout_s=timeout_s)  # fmt: skip
        summary = summarize_round(results, world)
        e, fb = summary["methods"][m["name"]], summary["fwd_bwd"]
        parts = {k: statistics.fmean(r["parts"].get(k, 0.0) for r in results) for k in PARTS}
        out[m["name"]] = {"step_s": e["step_s"], "forward_s": fb["forward_s"],
                          "backward_s": fb["backward_s"], "parts_s": parts,
                          "n_params": e["n_params"]}  # fmt: skip
    return out


def table(record: dict[str, Any]) -> list[str]:
    """Markdown rows: ms per step of each part and what is left of the step."""
    head = ["method", "step ms (profiled)", "forward", "backward", *PARTS, "rest"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in record["methods"].items():
        known = e["forward_s"] + e["backward_s"] + sum(e["parts_s"].values())
        cells = [e["step_s"], e["forward_s"], e["backward_s"],
                 *(e["parts_s"][k] for k in PARTS), e["step_s"] - known]  # fmt: skip
        rows.append(f"| {name} | " + " | ".join(f"{c * 1e3:.0f}" for c in cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=["dense-no-overlap", "scape-*"],
                        help="sweep method names or shell patterns")  # fmt: skip
    parser.add_argument("--steps", type=int, default=10, help="profiled steps per method")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    parser.add_argument("--model-overrides", nargs="*", default=[],
                        help="extra pretrain overrides for every method (e.g. a smaller model)")  # fmt: skip
    parser.add_argument("--data-root", type=Path, default=ROOT / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "results/bench/floor_parts.json")
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    protocol = quiet.protocol_from_args(args)
    quiet.require_quiet("bench-floor-parts", protocol.allow_busy)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="floor_parts_") as tmp_name:
        tmp = Path(tmp_name)
        methods = methods_for("sweep", args.world, args.data_root.resolve(), tmp / "runs",
                              args.model_overrides, only=args.methods)  # fmt: skip
        prepare_data({args.world: methods})
        record = quiet.run_round(
            f"floor parts w{args.world}",
            lambda: {
                "methods": measure(methods, args.world, args.steps, args.warmup, tmp, args.timeout)
            },  # fmt: skip
            protocol,
        )
    doc = {"bench": "floor_parts", "world_size": args.world, "steps": args.steps,
           "warmup": args.warmup, "started_at": started, "protocol": protocol.to_dict(),
           **record}  # fmt: skip
    print("\n".join(table(doc)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
