"""`make quality-transfer`: does the recipe's per-family lr rule hold where users meet it?

The recipe (:mod:`pipelines.studies.recipe`) reads SCAPE's lr ratio to dense AdamS off the
quality study's runs (W=4, 64-token sequences, its own base lr). The configs apply it on top
of whatever lr a setting has; ``make reproduce-table``'s setting (``conf/scale/tiny_table``:
2 ranks, 128-token sequences, 450 steps, an lr near dense AdamS's best there) is where users
meet it first. For every family whose rule is not x1, this runs that setting's model with the
SCAPE config at x1 and at the rule (the pretrain stage, 2 local ranks, ``SEEDS``) and records
each run's last validation loss. The recipe ships a rule only where it is no worse than x1
on every seed here (``results/quality/transfer_check.json``; the report reads it).

``--ramp`` asks the same of the density ramp (issue 41's early-gap candidate): SCAPE-99 with
and without it, both families, ``SEEDS``, into ``results/quality/ramp_transfer.json``.

``--grid`` (issue 52) asks what the multipliers are relative to: in that setting, on its
corpus, every arm of the table (dense AdamS and AdamW, SCAPE-90 and SCAPE-99 as shipped
but for the multiplier) on a grid of multipliers of the setting's one lr, each grid extended
past an edge best until closed, ``SEEDS``; written to ``results/early_gap/transfer_grid.json``
after every run (a rerun resumes), with each arm's best multiplier and SCAPE's best over
dense AdamS's and dense AdamW's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pipelines.studies.report_stats import SHIPPED_CONFIGS

__all__ = ["EXPERIMENTS", "GRID", "NO_RAMP", "RAMP", "SEEDS", "check", "check_grid", "check_ramp", "grid_text",
           "holds"]  # fmt: skip

EXPERIMENTS = {"llama": "llama500m_slimpj_quality", "gpt": "gpt345m_owt_quality"}
SEEDS = (1234, 1235)


def _last_val_loss(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return float([r["val_loss"] for r in records if "val_loss" in r][-1])


# The ramp as the quality study runs it (variant scape99_ramp): 90% -> 99% over 15% of the run,
# what conf/optimizer/scape99.yaml ships; NO_RAMP: the constant 99% beside it.
RAMP = ("optimizer.scape.ramp_start_sparsity=0.9", "optimizer.scape.ramp_fraction=0.15")
NO_RAMP = ("optimizer.scape.ramp_start_sparsity=null", "optimizer.scape.ramp_fraction=0")


def _run(variant: str, family: str, multiplier: float, seed: int, root: Path,
         extra: tuple[str, ...] = (), tag: str = "") -> float:  # fmt: skip
    name = f"{variant}{tag}-x{multiplier:g}-seed{seed}"
    overrides = [f"experiment={EXPERIMENTS[family]}", "scale=tiny_table", f"optimizer={variant}",
                 f"optimizer.lr_multiplier={multiplier}", f"train.seed={seed}",
                 f"output_root={root}", f"run_name={name}", "progress=false", *extra]  # fmt: skip
    subprocess.run([sys.executable, "-m", "pipelines.pretrain", *overrides], check=True,
                   capture_output=True)  # fmt: skip
    return _last_val_loss(root / EXPERIMENTS[family] / name)


def holds(entry: dict) -> bool:
    """The rule holds where it ends no worse than x1 on every seed."""
    return all(r <= x for r, x in zip(entry["rule"], entry["x1"], strict=True))


def check(recipe: dict, root: Path) -> dict:
    """Every (variant, family) whose rule is not 1, at x1 and at the rule, on every seed."""
    out = {"setting": "scale=tiny_table (make reproduce-table)", "seeds": list(SEEDS),
           "metric": "last validation loss of the pretrain stage", "checks": {}}  # fmt: skip
    for variant, entry in recipe["methods"].items():
        for family, fam in entry.get("families", {}).items():
            rule = fam.get("multiplier")
            if not rule or rule == 1.0 or family not in EXPERIMENTS:
                continue
            config = SHIPPED_CONFIGS.get(variant, variant)  # the study's variant as users run it
            result = {"multiplier": rule,
                      "x1": [_run(config, family, 1.0, s, root) for s in SEEDS],
                      "rule": [_run(config, family, rule, s, root) for s in SEEDS]}  # fmt: skip
            result["holds"] = holds(result)
            out["checks"].setdefault(variant, {})[family] = result
            print(f"{variant} {family}: x1 {result['x1']} x{rule:g} {result['rule']}: "
                  + ("holds" if result["holds"] else "does not hold"), flush=True)  # fmt: skip
    return out


def check_ramp(root: Path) -> dict:
    """SCAPE-99 with and without the ramp, at x1, in every family, on every seed."""
    out = {"setting": "scale=tiny_table (make reproduce-table)", "seeds": list(SEEDS),
           "metric": "last validation loss of the pretrain stage", "ramp": list(RAMP),
           "checks": {}}  # fmt: skip
    for family in EXPERIMENTS:
        result = {"constant": [_run("scape99", family, 1.0, s, root, NO_RAMP, "-constant")
                               for s in SEEDS],
                  "ramp": [_run("scape99", family, 1.0, s, root, RAMP, "-ramp") for s in SEEDS]}  # fmt: skip
        result["ramp_better_every_seed"] = all(
            r < c for r, c in zip(result["ramp"], result["constant"], strict=True)
        )
        out["checks"][family] = result
        print(f"scape99 {family}: constant {result['constant']} ramp {result['ramp']}", flush=True)
    return out


# The first multipliers of each arm's grid (x the setting's lr); an edge best extends it by x2
GRID = {"adams": (0.25, 0.5, 1.0, 2.0), "adamw": (0.25, 0.5, 1.0, 2.0),
        "scape90": (1.0, 2.0, 4.0), "scape99": (1.0, 2.0, 4.0)}  # fmt: skip
MAX_EXTENSIONS = 3


def _best(losses: dict[str, list[float]]) -> float:
    """The multiplier of lowest mean loss over seeds (keys are multipliers as text)."""
    return float(min(losses, key=lambda m: sum(losses[m]) / len(losses[m])))


def check_grid(root: Path, out: Path) -> dict:
    """Every arm on its grid, in every family, on every seed; ``out`` rewritten after every
    run and read back first, so an interrupted check resumes where it stopped."""
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update({"setting": "scale=tiny_table (make reproduce-table)", "seeds": list(SEEDS),
                   "metric": "last validation loss of the pretrain stage",
                   "multiplier": "x the setting's lr (optimizer.lr_multiplier)"})  # fmt: skip
    arms = result.setdefault("families", {})
    for family in EXPERIMENTS:
        for variant, first in GRID.items():
            losses = arms.setdefault(family, {}).setdefault(variant, {}).setdefault("losses", {})
            grid = sorted({*first, *map(float, losses)})
            for _ in range(MAX_EXTENSIONS + 1):
                for m in grid:
                    for seed in SEEDS[len(losses.get(f"{m:g}", [])) :]:
                        loss = _run(variant, family, m, seed, root, tag="-grid")
                        losses.setdefault(f"{m:g}", []).append(loss)
                        out.write_text(json.dumps(result, indent=1) + "\n")
                        print(f"{family} {variant} x{m:g} seed {seed}: {loss:.4f}", flush=True)
                best = _best(losses)
                if grid[0] < best < grid[-1]:
                    break
                if best == grid[-1]:
                    grid.append(best * 2)
                else:
                    grid.insert(0, best / 2)
            arms[family][variant]["best"] = _best(losses)
            arms[family][variant]["closed"] = (
                min(map(float, losses)) < _best(losses) < max(map(float, losses))
            )
        fam = arms[family]
        for variant in ("scape90", "scape99"):
            fam[variant]["over_adams"] = fam[variant]["best"] / fam["adams"]["best"]
            fam[variant]["over_adamw"] = fam[variant]["best"] / fam["adamw"]["best"]
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def grid_text(grid: dict, study_ratios: dict[str, dict[str, float]] | None = None) -> str:
    """The grid check as a table (mean loss over seeds per multiplier, the best in bold) and one
    sentence per SCAPE arm: its best multiplier over dense AdamS's and AdamW's, beside the
    study's (``study_ratios[family][variant]``: SCAPE's best lr over dense AdamS's there)."""
    rows = ["| family | arm | loss at each multiplier (x the setting's lr) | best | over AdamS's "
            "| over AdamW's |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for family, arms in grid.get("families", {}).items():
        for variant, entry in arms.items():
            losses = entry["losses"]
            if not losses:
                continue
            best = _best(losses)
            cells = ", ".join(
                (f"**x{m:g} {mean:.3f}**" if m == best else f"x{m:g} {mean:.3f}")
                + ("" if len(losses[key]) == len(grid["seeds"]) else f" (n={len(losses[key])})")
                for key in sorted(losses, key=float)
                for m, mean in [(float(key), sum(losses[key]) / len(losses[key]))]
            )  # fmt: skip
            closed = "" if entry.get("closed", True) else " (grid open)"
            ratio = [f"x{entry[k]:g}" if k in entry else "-" for k in ("over_adams", "over_adamw")]
            rows.append(f"| {family} | {variant} | {cells} | x{best:g}{closed} | {ratio[0]} | "
                        f"{ratio[1]} |")  # fmt: skip
    notes = []
    for family, ratios in (study_ratios or {}).items():
        for variant, ratio in ratios.items():
            here = grid.get("families", {}).get(family, {}).get(variant, {}).get("over_adams")
            if here is not None:
                notes.append(f"{variant} on {family}: x{here:g} dense AdamS's best here, "
                             f"x{ratio:g} in the study's setting")  # fmt: skip
    return ("\n".join(rows) + f"\n\n{grid.get('metric', '')}, mean over seeds "
            f"{', '.join(map(str, grid.get('seeds', [])))}; {grid.get('setting', '')}; the SCAPE "
            "arms are the configs as shipped but for the multiplier"
            + (". SCAPE's best lr over dense AdamS's: " + "; ".join(notes) if notes else "")
            + ".")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--recipe", type=Path, default=Path("results/quality/recipe.json"))
    p.add_argument("--out", type=Path, default=Path("results/quality/transfer_check.json"))
    p.add_argument("--runs", type=Path, default=Path("outputs/transfer_check"))
    p.add_argument("--ramp", action="store_true", help="the density ramp's check instead")
    p.add_argument("--grid", action="store_true",
                   help="every arm on a closed multiplier grid (results/early_gap/transfer_grid.json)")  # fmt: skip
    args = p.parse_args(argv)
    if args.grid:
        out = Path("results/early_gap/transfer_grid.json")
        check_grid(args.runs.with_name("transfer_grid"), out)
        print(f"wrote {out}")
        return 0
    if args.ramp:
        out = args.out.with_name("ramp_transfer.json")
        out.write_text(json.dumps(check_ramp(args.runs), indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    result = check(json.loads(args.recipe.read_text()), args.runs)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}; `make quality-report` carries it to recipe.json and the README")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
