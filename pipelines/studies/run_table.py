"""A table of finished pretrain runs: final validation loss, and the curve at a few steps.

    python -m pipelines.studies.run_table runs/dgc_long/peers_gpt345m_owt [--steps 400 800]
    python -m pipelines.studies.run_table results/peers/dgc_screen/long_runs.tar.xz

Reads each run's ``summary.json`` and ``metrics.jsonl`` (from a folder of run directories,
or from an xz tar of them) and prints a markdown table, with each run's gap to the first
``--reference`` run's final loss.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

__all__ = ["main", "read_runs", "table"]


def read_runs(source: Path) -> dict[str, tuple[float, dict[int, float]]]:
    """run name -> (final validation loss, {step: validation loss})."""
    files: dict[tuple[str, str], str] = {}
    if source.is_file():
        with tarfile.open(source, "r:xz") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    path = Path(m.name)
                    files[(path.parent.name, path.name)] = tar.extractfile(m).read().decode()
    else:
        for path in source.glob("*/*"):
            if path.name in ("summary.json", "metrics.jsonl"):
                files[(path.parent.name, path.name)] = path.read_text(encoding="utf-8")
    out = {}
    for (run, name), text in sorted(files.items()):
        if name != "summary.json":
            continue
        records = [json.loads(line) for line in files.get((run, "metrics.jsonl"), "").splitlines()]
        curve = {int(r["step"]): float(r["val_loss"]) for r in records if "val_loss" in r}
        out[run] = (float(json.loads(text)["final_val_loss"]), curve)
    return out


def table(runs: dict[str, tuple[float, dict[int, float]]], steps: list[int], reference: str) -> str:
    if reference not in runs:
        raise SystemExit(f"--reference {reference!r} is not one of the runs: {', '.join(runs)}")
    ref = runs[reference][0]
    head = ["run", *(f"val loss at {s}" for s in steps), "final val loss", f"gap to {reference}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, (final, curve) in runs.items():
        cells = [f"{curve[s]:.3f}" if s in curve else "-" for s in steps]
        gap = "reference" if name == reference else f"{100 * (final / ref - 1):+.1f}%"
        lines.append("| " + " | ".join([name, *cells, f"{final:.3f}", gap]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a folder of run directories, or an xz tar")
    parser.add_argument("--steps", type=int, nargs="*", default=[400, 800])
    parser.add_argument("--reference", default=None, help="run to take gaps to (first run)")
    args = parser.parse_args(argv)
    runs = read_runs(args.source)
    if not runs:
        raise SystemExit(f"{args.source}: no finished run (summary.json) found")
    print(table(runs, args.steps, args.reference or next(iter(runs))))


if __name__ == "__main__":
    main()
