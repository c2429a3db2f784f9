"""The quality study's report: runs indexed by horizon and lr, best-lr choice, paired gaps,
divergence, the lr grid table and the cost of each reading."""

from __future__ import annotations

import dataclasses

import pytest

from pipelines.studies.quality_config import VariantSpec
from pipelines.studies.reading_costs import reading_cost
from pipelines.studies.report_stats import VERDICT_METHODS, gap_cell
from pipelines.studies.report_tables import lr_table, staleness_table
from pipelines.studies.run_index import RunIndex, RunLog

S99 = VERDICT_METHODS[1][1]  # the verdict's SCAPE-99: the shipped config's study variant


def _log(variant: str, val: float, seed: int, *, steps=100, lr=1.0, diverged=False, code=None):
    header = {"model": "m", "variant": variant, "seed": seed, "steps": steps, "lr_scale": lr}
    if code is not None:
        header["code"] = {"commit": f"c-{code}", "dirty": False, "step_code": code}
    steps_ = [{"step": 1, "tokens": 8, "loss": val, "bytes": 1.0, "val_loss": val}]
    return RunLog(header, steps_, {"event": "final", "final_val_loss": val, "diverged": diverged})


def test_each_method_at_its_own_best_lr_paired_by_seed() -> None:
    index = RunIndex([
        _log("adams", 4.0, 0), _log("adams", 3.8, 0, lr=0.5), _log("adams", 3.9, 1, lr=0.5),
        _log("x", 4.2, 0), _log("x", 4.1, 0, lr=2.0), _log("x", 4.3, 1, lr=2.0),
        _log("y", 4.0, 0, diverged=True),
    ])  # fmt: skip
    assert index.best_lr("m", "adams", 100) == 0.5 and index.best_lr("m", "x", 100) == 2.0
    cell = gap_cell(index, "m", "x", 100)
    assert cell.lr == 2.0
    assert cell.gaps == pytest.approx([100 * 0.3 / 3.8, 100 * 0.4 / 3.9])
    assert cell.loss == pytest.approx(4.2)
    assert gap_cell(index, "m", "y", 100).gaps == [float("inf")]  # diverged: never "best"


def test_lr_is_chosen_by_the_mean_over_every_seed_and_an_edge_choice_is_an_open_grid() -> None:
    """Seed 0 alone would pick x1; the mean over seeds picks x0.5, an interior point. A
    point that diverges on one seed is never chosen; a point not run on every seed is not
    eligible."""
    runs = [_log("adams", v, s, lr=lr)
            for lr, vals in {0.25: (4.3, 4.3, 4.3), 0.5: (4.1, 4.0, 4.0),
                             1.0: (4.0, 4.5, 4.4), 2.0: (3.0, 3.0, 3.0)}.items()
            for s, v in enumerate(vals)]  # fmt: skip
    runs[-1] = _log("adams", 3.0, 2, lr=2.0, diverged=True)
    runs.append(_log("adams", 1.0, 0, lr=4.0))  # seed 0 only: not eligible
    index = RunIndex(runs)
    choice = index.lr_choice("m", "adams", 100)
    assert (choice.lr, choice.closed, choice.seeds) == (0.5, True, (0, 1, 2))
    assert choice.mean_loss == pytest.approx(4.1 / 3 + 8.0 / 3)
    table = lr_table(index, ["adams"], {}, ["m"], 100)
    assert "| adams | m | 3 | 4.300 | 4.033 | 4.300 | diverged | - | x0.5 |" in table
    edge = RunIndex([_log("x", 4.0 - lr, s, lr=lr) for lr in (0.5, 1.0) for s in (0, 1)])
    assert edge.lr_choice("m", "x", 100).closed is False
    assert "x1 (grid open)" in lr_table(edge, ["x"], {}, ["m"], 100)


def test_tables_use_one_code_version_and_say_which() -> None:
    """Runs of two code versions never share a cell: the version with most runs is used,
    the other counted as left out; stamped runs win over unstamped ones."""
    runs = [_log("adams", 4.0, 0, code="aaa"), _log("adams", 3.0, 1, code="aaa"),
            _log("adams", 9.0, 0, code="bbb"), _log("adams", 1.0, 0), _log("adams", 1.0, 1),
            _log("adams", 1.0, 2)]  # fmt: skip
    index = RunIndex(runs)
    assert index.code == "aaa" and len(index.runs) == 2 and index.commits == ["c-aaa"]
    assert index.left_out == {"bbb": 1, "unstamped": 3}
    text = index.provenance()
    assert "`aaa`" in text and "c-aaa" in text and "1 of `bbb`" in text
    assert RunIndex(runs, code="bbb").final(next(iter(RunIndex(runs, code="bbb").runs))) == 9.0
    legacy = RunIndex([_log("adams", 1.0, 0)])
    assert legacy.code == "unstamped" and "before runs recorded their code" in legacy.provenance()


def test_versions_a_replay_joined_share_the_tables_and_the_provenance_says_so() -> None:
    """With `ccc` recorded as replaying `aaa` bit for bit, their runs count as one version's
    (3 runs beat `bbb`'s 2); a key run at both is taken from the version named; `bbb` stays
    out."""
    runs = [_log("adams", 4.0, 0, code="aaa"), _log("adams", 3.0, 1, code="aaa"),
            _log("adams", 4.0, 0, code="ccc"), _log("adams", 2.0, 2, code="ccc"),
            _log("adams", 9.0, 0, code="bbb"), _log("adams", 9.0, 1, code="bbb")]  # fmt: skip
    same = [{"code": "ccc", "same_as": "aaa", "runs": ["r1", "r2"], "commit": "c0ffee1234567"}]
    index = RunIndex(runs, equivalences=same)
    assert index.code == "aaa" and index.codes == {"aaa", "ccc"}
    assert sorted(k.seed for k in index.runs) == [0, 1, 2] and index.left_out == {"bbb": 2}
    assert index.commits == ["c-aaa", "c-ccc"]
    text = index.provenance()
    assert "`ccc` (commit c0ffee1234) replayed 2 runs of `aaa`" in text and "2 of `bbb`" in text
    assert RunIndex(runs).codes == {"aaa"} and len(RunIndex(runs).runs) == 2  # no replay: apart
    from pipelines.studies.report_prose import finalists_text

    assert "(`aaa`, with `ccc`, joined by bit-for-bit replays" in finalists_text(
        index, {}, ["m"], [100]
    )
    # the same runs standing in for both SCAPE finalists too: a verdict to word
    index.runs.update({dataclasses.replace(k, variant=v): r
                       for k, r in list(index.runs.items()) for v in ("scape90", S99)})  # fmt: skip
    from pipelines.studies.report_prose import verdict_text

    assert ("(code version `aaa`, and 1 other version that replays showed to compute the same "
            "bits, results/quality/runs/equivalent.json)") in verdict_text(index, ["m"])  # fmt: skip


def test_costs_at_the_paper_shape() -> None:
    n, w = 1_800_000_000, 32
    dense = reading_cost(VariantSpec(method="adams"), n, w)
    assert dense.bytes_per_step == pytest.approx(2 * 2 * n * 31 / 32)
    scape99 = reading_cost(
        VariantSpec(method="scape", options={"chunk": 100, "sparsity": 0.99}), n, w
    )
    # the library's own formula: values 2 x 2 bytes x n / 100, one mask byte per coefficient
    from scape.comm import MASKS, step_bytes_per_rank

    library = step_bytes_per_rank([n / 100 / w], w, 2, masks=True)
    assert scape99.bytes_per_step == pytest.approx(sum(library.values()))
    assert scape99.mask_bytes == pytest.approx(library[MASKS])
    assert scape99.bytes_per_step == pytest.approx((4 * n / 100 + n / 100) * 31 / 32, rel=1e-6)
    assert dense.bytes_per_step / scape99.bytes_per_step == pytest.approx(80, rel=1e-6)
    assert scape99.memory == pytest.approx(3 * 4 * n)  # moment, fp32 params, second moment
    dgc = {"reading": "dgc", "basis": "identity", "chunk": 0, "sparsity": 0.99}
    dgc99 = reading_cost(VariantSpec(method="reading", options=dgc), n, w)
    # every rank's n / 100 bf16 values and int32 indices, all-gathered to all 32 ranks
    assert dgc99.bytes_per_step == pytest.approx(n / 100 * 6 * 32 * 31 / 32)
    assert dgc99.mask_bytes == pytest.approx(n / 100 * 4 * 32 * 31 / 32)
    assert dgc99.bytes_per_step > 30 * scape99.bytes_per_step  # it grows with W, SCAPE's not


def test_overview_row_per_reading_with_gaps_per_horizon_and_costs() -> None:
    from pipelines.studies.quality_config import ReadingRow
    from pipelines.studies.report_tables import overview_table

    index = RunIndex([
        _log("adams", 4.0, 0), _log("adams", 3.0, 0, steps=1500),
        _log("s90", 4.4, 0), _log("s99", 4.8, 0), _log("s99", 3.3, 0, steps=1500),
    ])  # fmt: skip
    variants = {
        "s90": VariantSpec(method="scape", options={"sparsity": 0.9}),
        "s99": VariantSpec(method="scape", options={"sparsity": 0.99}),
    }
    row = ReadingRow(name="R6", variants=["s90", "s99"], what="a | b", abstract="C1-C5")
    table = overview_table(index, [row], variants, ["m"], [100, 1500], ("x", 10**9, 32))
    cells = [c.strip() for c in table.splitlines()[-1].strip("|").split(" | ")]
    assert cells[:3] == ["R6", "a \\| b", "C1-C5"]
    assert cells[3:5] == ["+10.0 / -", "+20.0 / +10.0"]  # 90%, 99% at 100 / 1500 steps
    costs = [reading_cost(v, 10**9, 32) for v in variants.values()]
    assert cells[5] == " / ".join(f"{c.bytes_per_step / 1e6:,.0f}" for c in costs)


def test_staleness_table_lists_only_runs_that_recorded_it() -> None:
    stale = _log("r3", 4.5, 0)
    stale.final.update(max_staleness=87, replica_gap=0.0123)
    index = RunIndex([_log("adams", 4.0, 0), stale])
    table = staleness_table(index, {"r3": "R3-99"})
    assert "| R3-99 | m | 100 | x1 | 0 | 87 | 1.23% |" in table
    assert "adams" not in table
    assert staleness_table(RunIndex([_log("adams", 4.0, 0)]), {}) == ""


def _grid(variant: str, model: str, losses: dict[float, list[float]], steps=100):
    out = []
    for lr, per_seed in losses.items():
        for seed, val in enumerate(per_seed):
            run = _log(variant, val, seed, steps=steps, lr=lr, code="v")
            run.header["model"], run.header["params"] = model, 220_000
            out.append(run)
    return out


def test_verdict_reads_every_figure_from_the_runs_and_rewrites_the_marked_blocks(tmp_path):
    from pipelines.studies.report_prose import update_block, verdict_text

    def index(scape99_loss: float) -> RunIndex:
        runs = []
        for model in ("llama", "gpt"):
            runs += _grid("adams", model, {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.3]})
            runs += _grid("scape90", model, {1.0: [4.04, 3.96]})
            runs += _grid(S99, model, {0.5: [5.0, 5.0], 1.0: [scape99_loss] * 2,
                                             2.0: [5.0, 5.0]})  # fmt: skip
        return RunIndex(runs)

    text = verdict_text(index(4.4), ["llama", "gpt"])
    assert "At 90% sparsity SCAPE-90 ends +0.0 ± 1.4% (n=2) on llama (0.22M;" in text
    assert "ahead of dense AdamS in 1 of 2 seeds; lr grid open for SCAPE-90" in text
    assert "At 99% sparsity SCAPE-99 ends +10.0 ± 0.0% (n=2) on llama" in text
    assert "behind dense AdamS in every seed)" in text and "at 100 steps" in text
    assert "code version `v`" in text and "c-v" in text
    other = verdict_text(index(4.2), ["llama", "gpt"])  # other runs, other figures
    assert "+5.0 ± 0.0% (n=2)" in other and "+10.0" not in other
    assert verdict_text(RunIndex([]), ["llama"]).startswith("No verdict at one code version")
    # A longer horizon run only in part (one lr: every grid open) does not displace a
    # shorter one whose grids are all closed; with none closed, the longest run is used.
    partial = [r for m in ("llama", "gpt") for v in ("adams", "scape90", S99)
               for r in _grid(v, m, {1.0: [3.0, 3.0]}, steps=200)]  # fmt: skip
    closing = [r for m in ("llama", "gpt")
               for r in _grid("scape90", m, {0.5: [4.1, 4.1], 2.0: [4.1, 4.1]})]  # fmt: skip
    runs_100 = index(4.4).all_runs
    assert "at 100 steps" in verdict_text(RunIndex(runs_100 + closing + partial), ["llama", "gpt"])
    assert "at 200 steps" in verdict_text(RunIndex(runs_100 + partial), ["llama", "gpt"])

    readme = tmp_path / "README.md"
    readme.write_text("# T\n<!-- verdict:begin -->\nold\n<!-- verdict:end -->\nrest\n")
    assert update_block(readme, text)
    assert (
        readme.read_text() == f"# T\n<!-- verdict:begin -->\n{text}\n<!-- verdict:end -->\nrest\n"
    )
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    assert not update_block(bare, text) and bare.read_text() == "no markers\n"


def test_recipe_is_a_rule_only_where_every_model_agrees_on_closed_grids():
    from pipelines.studies.recipe import recipe, recipe_text, ship

    runs = []
    for model in ("llama", "gpt"):
        runs += _grid("adams", model, {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.3]})
        runs += _grid(S99, model, {1.0: [5.0, 5.0], 2.0: [4.5, 4.5], 4.0: [4.9, 4.9]})
        runs += _grid("scape90", model, {1.0: [4.0, 4.0]})  # one point: never closed
    short = recipe(RunIndex(runs), ["llama", "gpt"])["methods"][S99]
    short.pop("families")
    assert short == {"multiplier": None, "steps": {"llama": 100, "gpt": 100},
                     "ratios": {"llama": 2.0, "gpt": 2.0}}  # fmt: skip
    for run in runs:  # the same runs at a horizon long enough for a rule
        run.header["steps"] = 1500
    out = recipe(RunIndex(runs), ["llama", "gpt"])
    assert {k: v for k, v in out["methods"][S99].items() if k != "families"} == {
        "multiplier": 2.0, "steps": {"llama": 1500, "gpt": 1500},
                                         "ratios": {"llama": 2.0, "gpt": 2.0}}  # fmt: skip
    assert out["methods"]["scape90"]["multiplier"] is None and out["code"] == "v"
    assert out["methods"]["scape90"]["ratios"] == {"llama": None, "gpt": None}
    text = recipe_text(out, RunIndex(runs), {})
    assert "**SCAPE-99**: lr x2 dense AdamS's on every model" in text
    # the config carries the rule for a family only where the transfer check found it holds
    assert "carries it for no family and x1 for gpt and llama, where the transfer check" in text
    check = {"multiplier": 2.0, "x1": [4.5, 4.5], "rule": [4.4, 4.4], "holds": True}
    ship(out, {"checks": {S99: {"llama": check}}})
    assert "carries it for llama and x1 for gpt, where" in recipe_text(out, RunIndex(runs), {})
    ship(out, {"checks": {S99: {"llama": check, "gpt": check}}})
    assert "carries it (`lr_multiplier_by_family`)" in recipe_text(out, RunIndex(runs), {})
    assert "**SCAPE-90**: no rule" in text and "llama (0.22M): grids not closed" in text
    # a third model that ran the method, with a closed grid at another ratio, withdraws it
    big = _grid("adams", "llama192", {0.5: [4.2], 1.0: [4.0], 2.0: [4.1]}, steps=1500)
    big += _grid(S99, "llama192", {2.0: [4.6], 4.0: [4.4], 8.0: [4.7]}, steps=1500)
    both = recipe(RunIndex(runs + big), ["llama", "gpt", "llama192"])["methods"][S99]
    assert both["multiplier"] is None and both["ratios"]["llama192"] == 4.0
    assert "x1-x8" in recipe_text({"methods": {S99: both}, "min_steps": 1500},
                                  RunIndex(runs + big), {})  # fmt: skip
    runs = [r for r in runs if not (r.model == "gpt" and r.variant == S99
                                    and r.header["lr_scale"] == 1.0)]  # fmt: skip
    runs += _grid(S99, "gpt", {0.5: [4.6, 4.6], 1.0: [4.4, 4.4]}, steps=1500)  # x1 now
    split = recipe(RunIndex(runs), ["llama", "gpt"])["methods"][S99]
    assert split["multiplier"] is None and split["ratios"] == {"llama": 2.0, "gpt": 1.0}


def test_divergence_summary_counts_what_the_runs_show():
    from pipelines.studies.report_prose import divergence_summary

    runs = [_log("adams", 4.0, 0), _log("x", 9.0, 0, diverged=True), _log("y", 4.1, 1)]
    runs[2].final["spike_steps"] = 3
    text = divergence_summary(RunIndex(runs))
    assert text.startswith("1 of 3 runs diverged") and "m x x1 s0 t100" in text
    assert "1 had at least one step above that level and recovered." in text
    calm = divergence_summary(RunIndex([_log("adams", 4.0, 0)]))
    assert calm.startswith("0 of 1 runs diverged") and "No run had a step" in calm


def _sized(model: str, params: int, variant: str, losses: dict[float, list[float]], steps=100):
    runs = _grid(variant, model, losses, steps)
    for run in runs:
        run.header.update(params=params, family="llama")
        run.header["settings"] = {"scale": {"clip_grad": 0.5}}
        run.steps[-1]["bytes"] = 1000.0 if "bf16" not in variant else 600.0
    return runs


def test_bf16_wire_rows_pair_seeds_at_the_fp32_lr_and_judge_by_its_seed_spread(tmp_path):
    from pipelines.studies.report_prose import finalists_text
    from pipelines.studies.report_stats import WIRE_PAIRS, paired_rows
    from pipelines.studies.report_tables import paired_table

    runs = _sized("llama", 220_000, "adams", {0.5: [4.3, 4.3, 4.3], 1.0: [4.0, 4.1, 4.2],
                                             2.0: [4.4, 4.4, 4.4]})  # fmt: skip
    runs += _sized("llama", 220_000, "scape99", {0.5: [4.5, 4.5, 4.5], 1.0: [4.2, 4.3, 4.4],
                                                 2.0: [4.6, 4.6, 4.6]})  # fmt: skip
    runs += _sized("llama", 220_000, "scape99_bf16", {1.0: [4.25, 4.35, 4.45]})  # +0.05 each
    runs += _sized("llama", 220_000, "scape90", {1.0: [4.1, 4.1, 4.1]})
    runs += _sized("llama", 220_000, "scape90_bf16", {1.0: [4.3, 4.3, 4.3]})  # sd 0: outside
    index = RunIndex(runs)
    (r90, r99) = paired_rows(index, ["llama"], 100, WIRE_PAIRS)
    assert (r99["variant"], r99["lr"], r99["seeds"]) == ("scape99", 1.0, [0, 1, 2])
    assert r99["diff"] == pytest.approx(0.05) and r99["base_sd"] == pytest.approx(0.1)
    assert r99["within"] and not r90["within"] and r99["bytes"] == {"scape99": 1000.0,
                                                                    "scape99_bf16": 600.0}  # fmt: skip
    table = paired_table([r99], {"scape99": "SCAPE-99"}, ("fp32 wire", "bf16 wire"))
    assert (
        "| llama | SCAPE-99 | 1 | 3 | 4.300 | 4.350 | +0.0500 ± 0.0000 | 0.1000 | yes | 1,000 -> 600 |"
        in table
    )
    text = finalists_text(index, {}, ["llama"], [100])
    assert "within the fp32 wire's seed spread in 1 of 2 cells" in text
    from pipelines.studies.recipe import wire_choice

    assert wire_choice(index, ["llama"]) == {"value_dtype": "float32", "steps": 100,
                                             "within": 1, "cells": 2}  # fmt: skip
    calm = [r for r in runs if r.variant != "scape90_bf16"]
    calm += _sized("llama", 220_000, "scape90_bf16", {1.0: [4.1, 4.1, 4.1]})  # no change
    assert wire_choice(RunIndex(calm), ["llama"])["value_dtype"] == "bfloat16"
    assert wire_choice(RunIndex(calm), ["llama", "gpt"])["value_dtype"] == "float32"  # gpt: none
    assert "clips at a global norm of 0.5" in text and "Gap against model size" not in text
    assert "lr) by llama 100: 0.100 nats (2.4%). 0 of 27 runs diverged" in text
    assert "The clip's effect" not in text
    # the unclipped arms, paired the same way: their own rows and sentence
    noclip = _sized("llama", 220_000, "scape99_noclip", {1.0: [4.6, 4.7, 4.8]})  # +0.4 each
    for run in noclip:
        run.header["settings"] = {"scale": {"clip_grad": 0.0}, "variant": {"clip_grad": 0.0}}
    text = finalists_text(RunIndex(runs + noclip), {}, ["llama"], [100])
    assert "clips at a global norm of 0.5 (" in text  # the control arm is not the policy
    assert "The clip's effect at 100 steps" in text and "in 0 of 1 cells" in text
    assert "| llama | scape99 | 1 | 3 | 4.300 | 4.700 | +0.4000 ± 0.0000 | 0.1000 | no |\n" in text
    assert "clipped -> unclipped" not in text  # the same bytes: no bytes column


def test_size_table_and_panel_follow_the_sizes_that_were_run(tmp_path):
    from pipelines.studies.report_figures import plot_gap_vs_steps
    from pipelines.studies.report_stats import size_models
    from pipelines.studies.report_tables import size_table

    runs = []
    for model, params, gap in (("llama320", 8_000_000, 0.4), ("llama", 220_000, 0.2),
                               ("llama192", 2_000_000, 0.3)):  # fmt: skip
        runs += _sized(model, params, "adams", {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.1]})
        runs += _sized(model, params, S99, {1.0: [4.0 + gap, 4.0 + gap]})
    index = RunIndex(runs)
    assert size_models(index) == ["llama", "llama192", "llama320"]
    table = size_table(index, [S99], {S99: "SCAPE-99"}, [100])
    rows = table.splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| llama", "| llama192", "| llama320"]
    assert "| llama320 | 8.00M | 100 | 1 | +10.0 ± 0.0% (n=2) (1, grid open) |" in table
    png = tmp_path / "gap.png"
    plot_gap_vs_steps(index, [S99], {}, ["llama"], [100], png, sizes=size_models(index))
    assert png.stat().st_size > 0
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[1] > 1.8 * 6.5 * 100  # two panels wide


def _three_sizes(gaps: dict[str, list[float]]) -> RunIndex:
    """AdamS at 4.0 on every seed and SCAPE-99 at 4.0 * (1 + gap/100), both at x1 with
    their grids closed."""
    runs = []
    for model, params in (("llama", 220_000), ("llama192", 2_000_000), ("llama320", 8_000_000)):
        n = len(gaps[model])
        runs += _sized(model, params, "adams", {0.5: [4.2] * n, 1.0: [4.0] * n, 2.0: [4.1] * n})
        best = [4.0 * (1 + g / 100) for g in gaps[model]]
        worse = [b + 0.5 for b in best]
        runs += _sized(model, params, S99, {0.5: worse, 1.0: best, 2.0: worse})
    return RunIndex(runs)


def test_size_trend_is_least_squares_in_log_parameters_with_a_t_interval():
    import numpy as np

    from pipelines.studies.report_stats import T95, size_trend

    gaps = {"llama": [6.0, 7.0], "llama192": [8.0, 8.5], "llama320": [9.0, 10.5]}
    trend = size_trend(_three_sizes(gaps), S99, 100)
    xs = np.log10([220_000] * 2 + [2_000_000] * 2 + [8_000_000] * 2)
    ys = np.array(gaps["llama"] + gaps["llama192"] + gaps["llama320"])
    slope, intercept = np.polyfit(xs, ys, 1)
    assert trend.slope == pytest.approx(slope) and trend.intercept == pytest.approx(intercept)
    resid = ys - (intercept + slope * xs)
    se = np.sqrt(resid @ resid / 4 / ((xs - xs.mean()) ** 2).sum())
    lo, hi = trend.slope_interval()
    assert (lo, hi) == pytest.approx((slope - T95[3] * se, slope + T95[3] * se))
    at = trend.interval(500_000_000)
    assert at[0] < intercept + slope * np.log10(5e8) < at[1]
    assert size_trend(_three_sizes(gaps), "scape90", 100) is None  # never run
    one_size = RunIndex([r for r in _three_sizes(gaps).all_runs if r.model == "llama"])
    assert size_trend(one_size, S99, 100) is None


def test_scale_text_reads_the_trend_and_the_paper_sizes_from_its_inputs():
    from pipelines.studies.report_prose import scale_text

    paper = {"Llama-500M": 495_000_000}
    grows = scale_text(_three_sizes({"llama": [6.0, 7.0], "llama192": [8.0, 8.5],
                                     "llama320": [9.0, 10.5]}), {}, [100], paper)  # fmt: skip
    assert "**SCAPE-99, 100 steps**: +6.5 ± 0.7% (n=2) at 0.22M" in grows
    assert "at 8.00M" in grows and "the gap grows with size" in grows
    assert "Llama-500M (495M, 1.8 decades past the largest size run)" in grows
    flat = scale_text(_three_sizes({"llama": [6.0, 9.0], "llama192": [9.0, 6.0],
                                    "llama320": [6.5, 8.5]}), {}, [100], paper)  # fmt: skip
    assert "no trend resolved, the interval holds zero" in flat and "grows" not in flat
    assert "+7.5 ± 2.1% (n=2) at 0.22M" in flat
    none = scale_text(RunIndex([]), {}, [100], paper)
    assert none.startswith("Sizes of the llama run at this code version: none.")


def test_clip_table_counts_the_logged_steps_whose_pre_clip_norm_exceeded_the_clip():
    from pipelines.studies.report_prose import finalists_text
    from pipelines.studies.report_stats import clip_share
    from pipelines.studies.report_tables import clip_table

    runs = _sized("llama", 220_000, "adams", {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.1]})
    runs += _sized("llama", 220_000, "scape99", {1.0: [4.4, 4.4]})
    for run in runs:  # clip_grad is 0.5 in _sized's settings
        norms = [0.4, 0.6, 0.7, 0.2] if run.variant == "scape99" else [0.1, 0.2, 0.3, 0.9]
        run.steps = [{"step": 10 * i, "grad_norm": n} for i, n in enumerate(norms)]
    assert clip_share(runs[-1], 0.5) == (0.5, 0.5)
    table = clip_table(RunIndex(runs), ["adams", "scape99"], {"scape99": "SCAPE-99"},
                       ["llama"], [100])  # fmt: skip
    assert "| adams | 25% (0.25) |" in table and "| SCAPE-99 | 50% (0.50) |" in table
    assert "How often the clip acted" in finalists_text(RunIndex(runs), {}, ["llama"], [100])
    for run in runs:
        run.steps = [{"step": 10, "loss": 4.0}]  # no norm logged: no table
    assert clip_table(RunIndex(runs), ["adams"], {}, ["llama"], [100]) == ""


def test_the_size_trend_leaves_out_a_size_whose_lr_grid_is_open():
    from pipelines.studies.report_prose import scale_text
    from pipelines.studies.report_stats import size_trend

    index = _three_sizes({"llama": [6.0, 7.0], "llama192": [8.0, 8.5], "llama320": [9.0, 10.5]})
    runs = [
        r
        for r in index.all_runs  # llama320's AdamS only at x1: its grid is open
        if not (r.model == "llama320" and r.variant == "adams" and r.header["lr_scale"] != 1.0)
    ]
    open_big = RunIndex(runs)
    assert {p for p, _ in size_trend(open_big, S99, 100).points} == {220_000, 2_000_000}
    text = scale_text(open_big, {}, [100], {})
    assert "at 8.00M, lr grid open: not in the fit" in text and "over the 4 seeds' gaps" in text
    two_open = RunIndex([r for r in runs if not (r.model == "llama192" and r.variant == "adams"
                                                 and r.header["lr_scale"] != 1.0)])  # fmt: skip
    assert size_trend(two_open, S99, 100) is None
    assert "no trend" not in scale_text(two_open, {}, [100], {})


def test_the_family_rule_is_the_sizes_ratio_where_three_agree_else_the_least_worst_gap():
    from pipelines.studies.recipe import family_multipliers, recipe, recipe_text

    adams = {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.3]}  # chosen x1, closed
    runs = []
    for model in ("llama", "llama192", "llama320"):  # three Llama sizes agree on x2
        runs += _grid("adams", model, adams, steps=1500)
        runs += _grid(S99, model, {1.0: [4.8, 4.8], 2.0: [4.4, 4.4], 4.0: [4.6, 4.6]},
                      steps=1500)  # fmt: skip
    # gpt alone: SCAPE-99 best at x1 (a gap of +5% there, +10% at x2)
    runs += _grid("adams", "gpt", adams, steps=1500)
    runs += _grid(S99, "gpt", {0.5: [4.5, 4.5], 1.0: [4.2, 4.2], 2.0: [4.4, 4.4]},
                  steps=1500)  # fmt: skip
    # SCAPE-90 on two Llama sizes that disagree (x2 and x4): the least worst gap over both
    runs += _grid("scape90", "llama", {1.0: [4.3, 4.3], 2.0: [4.05, 4.05], 4.0: [4.1, 4.1],
                                       8.0: [4.5, 4.5]}, steps=1500)  # fmt: skip
    runs += _grid("scape90", "llama192", {1.0: [4.5, 4.5], 2.0: [4.3, 4.3], 4.0: [4.04, 4.04],
                                          8.0: [4.2, 4.2]}, steps=1500)  # fmt: skip
    for run in runs:
        run.header["family"] = "gpt" if run.header["model"] == "gpt" else "llama"
    index = RunIndex(runs)
    rec = recipe(index, ["llama", "gpt", "llama192", "llama320"])
    s99 = rec["methods"][S99]["families"]
    assert (s99["llama"]["multiplier"], s99["llama"]["rule"]) == (2.0, "sizes agree")
    assert (s99["gpt"]["multiplier"], s99["gpt"]["rule"]) == (1.0, "least worst gap")
    assert s99["llama"]["gaps"]["llama"]["rule"] == pytest.approx(10.0)  # 4.4 against 4.0
    assert s99["llama"]["gaps"]["llama"]["x1"] == pytest.approx(20.0)  # 4.8 against 4.0
    s90 = rec["methods"]["scape90"]["families"]["llama"]
    # x2: worst of (+1.25%, +7.5%); x4: worst of (+2.5%, +1.0%): x4 is least
    assert (s90["multiplier"], s90["rule"]) == (4.0, "least worst gap")
    assert family_multipliers(rec, S99) == {"gpt": 1.0, "llama": 2.0}
    text = recipe_text(rec, index, {})
    assert (
        "| SCAPE-99 | llama | x2 (3 sizes agree) | llama (0.22M) | 1,500 | +10.0% | +20.0% |"
        in text
    )


def test_the_verdict_states_the_gap_to_adamw_beside_adamss():
    from pipelines.studies.report_prose import verdict_text

    runs = []
    for model in ("llama", "gpt"):
        runs += _grid("adams", model, {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.1]})
        runs += _grid("adamw", model, {0.5: [4.0, 4.0], 1.0: [3.9, 3.9], 2.0: [3.95, 3.95]})
        for variant in ("scape90", S99):
            runs += _grid(variant, model, {0.5: [4.3, 4.3], 1.0: [4.1, 4.1], 2.0: [4.2, 4.2]})
    text = verdict_text(RunIndex(runs), ["llama", "gpt"])
    # 4.1 against AdamS's 4.0: +2.5%; against AdamW's 3.9: +5.1%, behind it in every seed
    assert "+2.5 ± 0.0% (n=2) on llama" in text
    assert "+5.1 ± 0.0% (n=2) against dense AdamW (behind it in every seed)" in text


def test_the_length_table_gives_each_horizons_gap_and_its_epochs(tmp_path):
    import json

    from pipelines.studies.report_prose import length_text, train_tokens

    runs = []
    for steps in (100, 400):
        runs += _grid("adams", "llama", {1.0: [4.0, 4.0]}, steps=steps)
        runs += _grid(S99, "llama", {1.0: [4.4, 4.4]}, steps=steps)
    runs += _grid("adams", "llama", {0.5: [4.2, 4.2], 2.0: [4.1, 4.1]}, steps=100)  # closed
    for run in runs:
        run.header["settings"] = {"scale": {"world_size": 2, "batch_per_worker": 2,
                                            "seq_length": 8}}  # fmt: skip
    (tmp_path / "metadata.json").write_text(json.dumps({"splits": {"train": {"tokens": 3200}}}))
    text = length_text(RunIndex(runs), {S99: "SCAPE-99"}, ["llama"], train_tokens(tmp_path))
    # 32 tokens a step: 100 steps are 1.0 epoch of 3,200 tokens, 400 steps 4.0
    assert "| model | method | 100 steps (1.0 epochs) | 400 steps (4.0 epochs) |" in text
    assert (
        "| llama | SCAPE-99 | +10.0 ± 0.0% (n=2) (grid open) | +10.0 ± 0.0% (n=2) (grid open) |"
        in text
    )
    # the reference's own choice heads the model's rows
    assert "| llama | dense AdamS (the reference: its lr) | x1 | x1, grid open |" in text
    assert train_tokens(None) is None and train_tokens(tmp_path / "missing") is None


def test_the_early_gap_table_counts_every_runs_bytes_against_a_constant_scape99():
    from pipelines.studies.report_prose import early_gap_text

    runs = []
    runs += _grid("adams", "llama", {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.1]}, steps=1500)
    runs += _grid("scape99", "llama", {0.5: [4.5, 4.5], 1.0: [4.4, 4.4], 2.0: [4.6, 4.6]},
                  steps=1500)  # fmt: skip
    runs += _grid("scape99_w7", "llama", {0.5: [4.4, 4.4], 1.0: [4.3, 4.3], 2.0: [4.5, 4.5]},
                  steps=1500)  # fmt: skip
    for run in runs:  # a dense step sends 100 units, a sparse one 1 (the logged bytes)
        variant = run.header["variant"]
        warm = 7 if variant == "scape99_w7" else 1
        run.header["settings"] = {"variant": {"options": {"dense_warmup_steps": warm}}}
        run.steps[0]["step"] = 10
        run.steps[0]["bytes"] = 100.0 if variant == "adams" else 1.0
    assert "No early-gap candidate" in early_gap_text(RunIndex(runs[:6]), {}, ["llama"])
    text = early_gap_text(RunIndex(runs), {"scape99_w7": "W7"}, ["llama"])
    # (7 x 100 + 1,493) / (100 + 1,499) = 1.37; 4.3 vs AdamS's 4.0: +7.5%; vs SCAPE-99's 4.4: -2.3%
    assert "| llama | W7 | x1.37 | 1 | +7.5 ± 0.0% (n=2) |" in text
    assert "| +10.0 ± 0.0% (n=2) | -2.3 ± 0.0% (n=2) |" in text


def test_a_ramp_counts_its_logged_run_bytes_and_stands_by_training_length():
    """A ramp's steps send unequal bytes: the table reads its whole run's (``run_bytes``);
    the protocol's candidate is shown against the constant SCAPE-99 at every horizon run."""
    from pipelines.studies.report_prose import early_gap_text

    runs = []
    for steps in (300, 1500):
        runs += _grid("adams", "llama", {0.5: [4.2, 4.2], 1.0: [4.0, 4.0], 2.0: [4.1, 4.1]},
                      steps=steps)  # fmt: skip
        runs += _grid("scape99", "llama", {0.5: [4.5, 4.5], 1.0: [4.4, 4.4], 2.0: [4.6, 4.6]},
                      steps=steps)  # fmt: skip
        runs += _grid("scape99_ramp", "llama", {0.5: [4.4, 4.4], 1.0: [4.3, 4.3],
                                                2.0: [4.5, 4.5]}, steps=steps)  # fmt: skip
    for run in runs:
        run.header["settings"] = {"variant": {"options": {}}}
        run.steps[0]["step"] = 10
        run.steps[0]["bytes"] = 100.0 if run.header["variant"] == "adams" else 1.0
        if run.header["variant"] == "scape99_ramp":
            run.final["run_bytes"] = 2.0 * (100 + run.header["steps"] - 1)  # twice a constant's
    text = early_gap_text(RunIndex(runs), {"scape99_ramp": "R"}, ["llama"])
    assert "| llama | R | x2.00 | 1 | +7.5 ± 0.0% (n=2) |" in text
    assert "| model | 300 steps | 1,500 steps |" in text
    assert "| -2.3 ± 0.0% (n=2) (lr x1) | -2.3 ± 0.0% (n=2) (lr x1) |" in text


def test_the_verdict_says_how_the_shipped_scape99_ramps_and_what_its_bytes_cost():
    from pipelines.studies.report_prose import verdict_text

    runs = []
    for variant, loss in (("adams", 4.0), ("scape90", 4.1), ("scape99", 4.4), (S99, 4.3)):
        runs += _grid(variant, "llama", {0.5: [loss + 0.2] * 2, 1.0: [loss] * 2,
                                         2.0: [loss + 0.1] * 2}, steps=1000)  # fmt: skip
    for run in runs:
        options = {"sparsity": 0.99, "ramp_start_sparsity": 0.9, "ramp_steps": 150}
        run.header["settings"] = {"variant": {"options": options if run.variant == S99 else {}}}
        run.steps[0]["step"] = 10
        run.steps[0]["bytes"] = 100.0 if run.variant == "adams" else 1.0
        if run.variant == S99:
            run.final["run_bytes"] = 1.41 * (100 + 1000 - 1)  # x1.41 a constant run's
    text = verdict_text(RunIndex(runs), ["llama"])
    assert (
        "At 99% sparsity (after a density ramp from 90% over the first 15% of steps, x1.41 "
        "a constant 99% run's bytes) SCAPE-99 ends +7.5 ± 0.0% (n=2) on llama"
    ) in text
    assert "At 90% sparsity SCAPE-90 ends +2.5" in text  # no ramp, no clause


def test_a_family_rule_ships_only_where_the_transfer_check_holds():
    from pipelines.studies.recipe import family_multipliers, ship
    from pipelines.studies.transfer_check import holds

    def rec():
        return {"methods": {"scape99": {"families": {
            "llama": {"multiplier": 2.0}, "gpt": {"multiplier": 1.0}}}}}  # fmt: skip

    assert family_multipliers(ship(rec(), None), "scape99") == {"llama": 1.0, "gpt": 1.0}
    failed = {"multiplier": 2.0, "x1": [4.69, 4.75], "rule": [5.08, 4.70]}
    failed["holds"] = holds(failed)
    assert failed["holds"] is False  # worse than x1 on one seed is enough
    shipped = ship(rec(), {"checks": {"scape99": {"llama": failed}}})
    assert family_multipliers(shipped, "scape99") == {"llama": 1.0, "gpt": 1.0}
    passed = {**failed, "rule": [4.6, 4.7]}
    passed["holds"] = holds(passed)
    assert family_multipliers(ship(rec(), {"checks": {"scape99": {"llama": passed}}}),
                              "scape99") == {"llama": 2.0, "gpt": 1.0}  # fmt: skip
    other_rule = {**passed, "multiplier": 4.0}  # a check of another rule does not count
    assert family_multipliers(ship(rec(), {"checks": {"scape99": {"llama": other_rule}}}),
                              "scape99")["llama"] == 1.0  # fmt: skip
