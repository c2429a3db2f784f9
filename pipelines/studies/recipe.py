"""The recipe the shipped configs carry: SCAPE's lr over dense AdamS's per model and per
model family, and the values' dtype on the wire, read from the runs (``recipe.json``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from pipelines.studies.report_stats import SHIPPED_CONFIGS, VERDICT_METHODS, WIRE_PAIRS, paired_rows
from pipelines.studies.run_index import REFERENCE, RunIndex

__all__ = [
    "RECIPE_FAMILY_SIZES",
    "RECIPE_MIN_STEPS",
    "family_multipliers",
    "ship",
    "family_rule",
    "model_family",
    "recipe",
    "recipe_text",
    "wire_choice",
]


RECIPE_MIN_STEPS = 1500  # the shortest horizon whose lr ratio becomes the configs' rule
RECIPE_FAMILY_SIZES = 3  # sizes of a family that must agree for its ratio to be its rule


def model_family(index: RunIndex, model: str) -> str:
    """A model's family (gpt, llama) as its runs recorded it, else read off its name."""
    run = next((r for k, r in index.runs.items() if k.model == model), None)
    family = None if run is None else (run.header.get("family")
                                       or run.header.get("settings", {}).get("model", {}).get("family"))  # fmt: skip
    return family or ("gpt" if model.startswith("gpt") else "llama")


def _mean_gap(
    index: RunIndex, model: str, variant: str, steps: int, multiplier: float
) -> float | None:
    """SCAPE at ``multiplier`` x dense AdamS's chosen lr, paired by seed against AdamS there:
    the mean gap in percent over the seeds both ran (None where SCAPE did not run that lr)."""
    ref = index.best_lr(model, REFERENCE, steps)
    gaps = [] if ref is None else index.paired_gaps(model, variant, steps, multiplier * ref, ref)
    return statistics.fmean(gaps) if gaps else None


def family_rule(index: RunIndex, variant: str, ratios: dict[str, float | None],
                steps: dict[str, int | None]) -> dict[str, Any]:  # fmt: skip
    """One family's multiplier (its models' ``ratios`` at ``steps``, from :func:`recipe`):
    the ratio where at least :data:`RECIPE_FAMILY_SIZES` sizes have one at >=
    :data:`RECIPE_MIN_STEPS` steps and all agree ("sizes agree"); else, among the multipliers
    every such model ran, the one whose worst mean paired gap over the models is least
    ("least worst gap"); None where no model has a closed ratio that long."""
    measured = {m: r for m, r in ratios.items()
                if r is not None and (steps[m] or 0) >= RECIPE_MIN_STEPS}  # fmt: skip
    out: dict[str, Any] = {"multiplier": None, "rule": None, "models": sorted(measured)}
    if len(measured) >= RECIPE_FAMILY_SIZES and len(set(measured.values())) == 1:
        out.update(multiplier=next(iter(measured.values())), rule="sizes agree")
    elif measured:
        candidates = sorted({r * 2.0**i for r in measured.values() for i in range(-3, 4)})
        worst = {}
        for m in candidates:
            gaps = [_mean_gap(index, model, variant, steps[model], m) for model in measured]
            if all(g is not None for g in gaps):
                worst[m] = max(gaps)
        if worst:
            out.update(multiplier=min(worst, key=lambda m: (worst[m], abs(math.log2(m)))),
                       rule="least worst gap")  # fmt: skip
    multiplier = out["multiplier"] or 1.0
    out["gaps"] = {model: {"rule": _mean_gap(index, model, variant, steps[model], multiplier),
                           "x1": _mean_gap(index, model, variant, steps[model], 1.0),
                           "steps": steps[model]}
                   for model in measured}  # fmt: skip
    return out


def recipe(index: RunIndex, models: list[str]) -> dict[str, Any]:
    """SCAPE's lr over dense AdamS's, per SCAPE finalist and per model that ran it (``models``:
    the small ones and every size): the ratio of the chosen lrs at the model's longest
    horizon where both grids are closed (``ratios``, at ``steps``; None where none is);
    ``multiplier`` where every such model has a ratio at >= :data:`RECIPE_MIN_STEPS` and all
    agree; and per model family (``families``) the configs' rule (:func:`family_rule`), which
    conf/optimizer/<SHIPPED_CONFIGS[variant]>.yaml carries as ``lr_multiplier_by_family``. Shorter horizons
    give evidence, never a rule (the best lr moves with the horizon)."""
    out: dict[str, Any] = {"code": index.code, "commits": index.commits,
                           "min_steps": RECIPE_MIN_STEPS, "family_sizes": RECIPE_FAMILY_SIZES,
                           "methods": {}}  # fmt: skip
    horizons = sorted({k.steps for k in index.runs}, reverse=True)
    for _, variant, _ in VERDICT_METHODS:
        ratios: dict[str, float | None] = {}
        steps: dict[str, int | None] = {}
        for model in models:
            if not any((k.model, k.variant) == (model, variant) for k in index.runs):
                continue
            ratios[model] = steps[model] = None
            for h in horizons:
                c, r = index.lr_choice(model, variant, h), index.lr_choice(model, REFERENCE, h)
                if c and r and c.closed and r.closed:
                    ratios[model], steps[model] = c.lr / r.lr, h
                    break
        agree = (bool(ratios) and len(set(ratios.values())) == 1
                 and all(h is not None and h >= RECIPE_MIN_STEPS for h in steps.values()))  # fmt: skip
        families: dict[str, list[str]] = {}
        for model in ratios:
            families.setdefault(model_family(index, model), []).append(model)
        out["methods"][variant] = {
            "multiplier": next(iter(ratios.values())) if agree else None,
            "ratios": ratios, "steps": steps,
            "families": {f: family_rule(index, variant, {m: ratios[m] for m in ms},
                                        {m: steps[m] for m in ms})
                         for f, ms in sorted(families.items())},
        }  # fmt: skip
    return out


def ship(rec: dict[str, Any], transfer: dict[str, Any] | None) -> dict[str, Any]:
    """Each family's ``shipped`` multiplier: its rule where the rule is x1 or the transfer
    check (:mod:`pipelines.studies.transfer_check`, ``transfer_check.json``) found it no
    worse than x1 on every seed where users meet it; x1 where the check failed or has not
    run. The check's figures ride along (``transfer``)."""
    checks = (transfer or {}).get("checks", {})
    for variant, entry in rec["methods"].items():
        for family, fam in entry.get("families", {}).items():
            rule = fam.get("multiplier") or 1.0
            check = checks.get(variant, {}).get(family)
            if check is not None and check.get("multiplier") != rule:
                check = None  # a check of another rule says nothing about this one
            fam["transfer"] = check
            fam["shipped"] = rule if rule == 1.0 or (check and check["holds"]) else 1.0
    return rec


def family_multipliers(rec: dict[str, Any], variant: str) -> dict[str, float]:
    """The per-family multipliers the configs carry for the study's ``variant`` (:func:`ship`;
    the config that carries them: :data:`SHIPPED_CONFIGS`)."""
    families = rec["methods"].get(variant, {}).get("families", {})
    return {f: float(entry.get("shipped", entry["multiplier"] or 1.0))
            for f, entry in families.items()}  # fmt: skip


def wire_choice(index: RunIndex, models: list[str]) -> dict[str, Any]:
    """The values' dtype the SCAPE configs ship: bf16 where, at the longest horizon the bf16
    wire was run, it ran beside fp32 for every SCAPE finalist on every model and stayed
    within the fp32 wire's seed spread in every cell; fp32 otherwise (issue 27)."""
    horizons = sorted({k.steps for k in index.runs if k.variant in dict(WIRE_PAIRS).values()})
    for steps in reversed(horizons):
        rows = paired_rows(index, models, steps, WIRE_PAIRS)
        complete = {(r["model"], r["variant"]) for r in rows} == {
            (m, v) for m in models for v, _ in WIRE_PAIRS}  # fmt: skip
        if complete:
            within = sum(r["within"] for r in rows)
            return {"value_dtype": "bfloat16" if within == len(rows) else "float32",
                    "steps": steps, "within": within, "cells": len(rows)}  # fmt: skip
    return {"value_dtype": "float32", "steps": None, "within": 0, "cells": 0}


def recipe_text(rec: dict[str, Any], index: RunIndex, labels: dict[str, str]) -> str:
    """The recipe in a sentence per SCAPE finalist, every figure from ``rec``
    (:func:`recipe`): the rule the configs carry, or the ratios seen and how to tune."""
    lines = []
    for label, variant, _ in VERDICT_METHODS:
        entry = rec["methods"].get(variant)
        if not entry or not entry["ratios"]:
            lines.append(f"- **{label}**: not run at this code version.")
            continue
        seen = "; ".join(
            f"{m} ({index.params_text(m)}): "
            + ("grids not closed at any horizon" if r is None else f"x{r:g} at {h:,} steps")
            for m, r, h in ((m, r, entry["steps"][m]) for m, r in entry["ratios"].items())
        )  # fmt: skip
        if entry["multiplier"] is not None:
            config = f"`conf/optimizer/{SHIPPED_CONFIGS[variant]}.yaml`"
            held = {f: fam.get("shipped") == entry["multiplier"]
                    for f, fam in entry.get("families", {}).items()}  # fmt: skip
            carried = (f"{config} carries it (`lr_multiplier_by_family`)" if all(held.values()) else
                       f"{config} carries it for {_names([f for f, h in held.items() if h])} and "
                       f"x1 for {_names([f for f, h in held.items() if not h])}, where the "
                       "transfer check has not found it holds (below)")  # fmt: skip
            lines.append(f"- **{label}**: lr x{entry['multiplier']:g} dense AdamS's on every "
                         f"model ({seen}); {carried}.")  # fmt: skip
            continue
        known = sorted({r for r in entry["ratios"].values() if r is not None})
        tune = (f"sweep `optimizer.lr_multiplier` over x{known[0] / 2:g}-x{known[-1] * 2:g} "
                "(the ratios seen, a factor of 2 either side)" if known else
                "sweep `optimizer.lr_multiplier` in factors of 2 either side of 1")  # fmt: skip
        why = ("the models disagree" if len(known) > 1 else
               f"not yet closed at >= {rec['min_steps']:,} steps on every model")  # fmt: skip
        lines.append(f"- **{label}**: no rule for every model ({why}: {seen}); the config "
                     f"carries one per model family (below). To tune it on your model, {tune}.")  # fmt: skip
    wire = rec.get("wire") or {}
    if wire.get("cells"):
        lines.append(
            f"- **The values on the wire**: `{wire['value_dtype']}`, the SCAPE configs' "
            f"`optimizer.scape.value_dtype`. The bf16 wire stayed within the fp32 wire's seed "
            f"spread in {wire['within']} of {wire['cells']} cells at {wire['steps']:,} steps "
            + ("(every one)." if wire["value_dtype"] == "bfloat16" else
               "(not every one), so the configs send fp32 values."))  # fmt: skip
    elif wire:
        lines.append("- **The values on the wire**: `float32` (the bf16 wire has not been run "
                     "beside it on every model).")  # fmt: skip
    rows = []
    for label, variant, _ in VERDICT_METHODS:
        for family, entry in rec["methods"].get(variant, {}).get("families", {}).items():
            rule = ({"sizes agree": f"{len(entry['models'])} sizes agree",
                     "least worst gap": "least worst gap over the sizes run"}.get(entry["rule"])
                    or f"no closed ratio at >= {rec['min_steps']:,} steps: x1")  # fmt: skip
            shipped = _shipped_text(entry)
            for model, g in entry["gaps"].items():
                rows.append(f"| {label} | {family} | x{entry['multiplier'] or 1:g} ({rule}) | "
                            f"{model} ({index.params_text(model)}) | {g['steps']:,} | "
                            f"{_pct(g['rule'])} | {_pct(g['x1'])} | {shipped} |")  # fmt: skip
    if rows:
        lines += ["", "**The configs' rule, per model family** (`lr_multiplier_by_family` in "
                  "`conf/optimizer/scape90.yaml` / `scape99.yaml`, applied by the pretrain "
                  "stage to the model's family and printed at start-up): a family's ratio where "
                  f"{rec.get('family_sizes', RECIPE_FAMILY_SIZES)} or more of its sizes agree, "
                  "else the multiplier whose worst gap over the family's sizes is least. Each "
                  "size's mean paired gap to dense AdamS under the rule and under x1 (SCAPE at "
                  "AdamS's lr; - where not run):", "",
                  "| method | family | rule | model | steps | gap under the rule | gap under x1 "
                  "| shipped (the transfer check) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows, "",
                  "The transfer check (`make quality-transfer`): the rule and x1 where users meet "
                  "it first, `make reproduce-table`'s setting (2 ranks, 128-token sequences, 450 "
                  "steps), each seed's last validation loss; a rule ships only where it is no "
                  "worse than x1 on every seed there."]  # fmt: skip
    return "\n".join([
        "SCAPE's best lr over dense AdamS's best, each chosen over the seeds, per model at its "
        "longest horizon where both lr grids are closed (`recipe.json`):", "", *lines])  # fmt: skip


def _shipped_text(fam: dict[str, Any]) -> str:
    check, shipped = fam.get("transfer"), fam.get("shipped", fam["multiplier"] or 1.0)
    if (fam["multiplier"] or 1.0) == 1.0:
        return "x1"
    if check is None:
        return f"x{shipped:g} (not checked yet)"
    losses = ", ".join(
        f"{a:.3f} / {b:.3f}" for a, b in zip(check["x1"], check["rule"], strict=True)
    )
    verdict = "holds" if check["holds"] else "worse than x1"
    return f"x{shipped:g} (x1 / x{check['multiplier']:g} per seed: {losses}; {verdict})"


def _names(families: list[str]) -> str:
    return " and ".join(families) if families else "no family"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"
