"""results/bench/README.md from the benchmarks' JSON: section 2 and the targets from a
synthetic sweep, the other sections from their files, and no figure that is not read from
one of them."""

import json
import re
import shutil
from pathlib import Path

from benchmarks import report
from benchmarks.harness.records import Quiet, Round

BENCH = Path(__file__).resolve().parents[2] / "results" / "bench"


def _sweep_points(make_point):
    return [make_point("dense-no-overlap", 0.50, 0.10, 1.0),
            make_point("scape-99", 0.11, 0.10, 6.5, predicted={"total": 0.1155}),
            make_point("scape-99", 0.30, 0.20, 3.6, round="w4-1gbit", world_size=4, noisy=True,
                       predicted={"total": 0.39})]  # fmt: skip


def test_section_2_and_the_targets_from_the_sweep(tmp_path, write_sweep, make_point):
    q = Quiet([{}, {}], 0.31, 1.72, 0.02, 41.2, 44.8, False)
    rnd = Round("w2-1gbit", 2, "1gbit", 1000.0, quiet=q, forward_s=0.02, backward_s=0.04,
                seconds=60.0)  # fmt: skip
    write_sweep(tmp_path, _sweep_points(make_point), commit="abc1234", started_at="2026-12-03",
                complete=True, steps=10, warmup=3, rounds={"w2-1gbit": rnd},
                protocol={"max_load": 1.5, "max_other_cores": 0.25, "retries": 2})  # fmt: skip
    # the model line of section 2 reads a method's record
    doc = json.loads((tmp_path / "megatron_step.json").read_text())
    doc["rounds"]["w2-1gbit"]["methods"] = {"scape-99": {
        "label": "SCAPE-99", "optimizer": "scape", "model": "bench_llama", "n_params": 10_227_072,
        "buckets": 4, "value_collectives": 4, "overlap_grad_reduce": True,
        "values_in_grad_sync": True, "tokens_per_rank_step": 16, "step_s_all": [0.11],
        "bytes_per_rank": {}}}  # fmt: skip
    (tmp_path / "megatron_step.json").write_text(json.dumps(doc))
    md = report.render(tmp_path)
    sec2 = md.split("## 2.")[1].split("## 3.")[0]
    assert "at commit abc1234, started 2026-12-03: `engine.step`" in sec2
    assert "median [quartiles] of 10 steps after 3" in sec2
    assert "bench_llama, 10.2M parameters, 16 tokens per rank per step" in sec2
    assert ("| 2 x 1gbit | scape-99 | 110 [99-121] | 100 | 1.10 | x5.20 / x6.50 / x5.20 | 0.10 "
            "| 1,000.0 | 116 (+5%) | 0.30 / 1.20 |") in sec2  # fmt: skip
    assert "| 4 x 1gbit | scape-99 |" in sec2 and "0.30 / 1.20 **noisy** |" in sec2
    assert "| w2-1gbit | ok | 2 | 0.31 / 1.72 | 0.02 | 41 / 45 | 20 / 40 | 60 |" in sec2
    targets = md.split("## Targets")[1].split("## 1.")[0]
    assert "| 2 ranks, 1 Gbit/s: SCAPE-99 >= x5 faster than dense AdamS | x5.20 " in targets
    row4 = next(ln for ln in targets.splitlines() if ln.startswith("| 4 ranks"))
    assert row4.endswith("| not met (noisy) |") and "x2.88" in row4
    assert "| 1.10x (110 ms / 100 ms) | met |" in targets  # step within 1.25x its floor
    assert "1/2 within; worst 30% (4 x 1gbit scape-99) | not met |" in targets
    assert "SCAPE-90 >= x2.5 faster than dense AdamS | not measured at this commit" in targets


def test_a_missing_or_skipped_sweep_says_how_to_run_it(tmp_path, write_sweep):
    md = report.render(tmp_path)
    assert "has not been run at this commit: `make bench-step` (as root" in md
    write_sweep(tmp_path, [], skipped="not root: x")
    md = report.render(tmp_path)
    assert (
        "**Skipped:** not root: x" in md
        and "_projection.json missing: run `make bench-project`" in md
    )


def test_bytes_section_and_targets_from_the_formula(tmp_path):
    from benchmarks.bytes import paper_scale_bytes

    measured = {"world_size": 4, "n_params": 1_740_000, "padded": 1_740_800,
                "shard_sizes": [100_000, 335_200],
                "methods": {"dense-adams": {"bytes_per_rank": {"grad_values": 5.2e6,
                                                               "param_values": 5.2e6},
                                            "total": 10.4e6, "dense_over_this": 1.0,
                                            "this_over_value_limit": 1.0},
                            "scape-99": {"bytes_per_rank": {"grad_values": 52e3,
                                                            "param_values": 52e3,
                                                            "masks": 13e3},
                                         "formula": {}, "matches_formula": True,
                                         "total": 117e3, "dense_over_this": 88.9,
                                         "this_over_value_limit": 1.125}}}  # fmt: skip
    paper = {m: paper_scale_bytes(n, 32) for m, n in (("gpt-345m", 354_871_296),
                                                      ("llama-1.8b", 1_800_000_000))}  # fmt: skip
    doc = {"model": {"seq": 32}, "measured": measured, "paper_scale": paper}
    (tmp_path / "bytes.json").write_text(json.dumps(doc))
    md = report.render(tmp_path, wire="float32")
    sec1 = md.split("## 1.")[1].split("## 2.")[0]
    assert "| scape-99 | 52.0 | 52.0 | 13.0 | 117.0 | 88.9 | 1.12 | = |" in sec1
    assert "| scape-99-bf16 |" in sec1 and "| dense-adams |" in sec1
    assert "4 gloo ranks" in sec1 and "1.74M parameters, 32 tokens" in sec1
    targets = md.split("## Targets")[1].split("## 1.")[0]
    row99 = next(ln for ln in targets.splitlines() if "99% sparsity" in ln)
    assert "with bf16 values" in row99 and "counters match the formula" in row99
    # fp32 values: 1/44, below 1/60; the steady step's, and the shipped ramp's mean over a run
    assert row99.endswith("| met with bf16 values (steady step) |")
    assert "over a run the shipped config's density ramp makes it 1/55" in row99
    assert "with fp32 values (the configs')" in row99 and "(fp32 ones are what" in sec1
    # configs that send bf16 values: the rows lead with them, and the target is met as shipped
    bf16 = report.render(tmp_path, wire="bfloat16")
    row99 = next(ln for ln in bf16.split("## Targets")[1].splitlines() if "99% sparsity" in ln)
    assert (
        row99.endswith("| met (steady step) |") and "with bf16 values (the configs'), 1/" in row99
    )
    assert "| scape-99-shipped-run |" in bf16 and "density ramp from 90%" in bf16
    assert report.shipped_wire() in ("float32", "bfloat16")


def _bench_copy(tmp_path: Path) -> Path:
    """The committed JSON of results/bench (no sweep) in a fresh folder."""
    d = tmp_path / "bench"
    d.mkdir()
    for name in ("bytes.json", "overhead.json", "projection.json", "floor_parts.json",
                 "break_even.json", "break_even.md"):  # fmt: skip
        shutil.copy(BENCH / name, d / name)
    return d


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def test_sections_3_and_4_from_their_files(tmp_path):
    d = _bench_copy(tmp_path)
    _edit(d / "floor_parts.json", lambda doc: doc["methods"]["scape-99"].update(step_s=0.4321))
    _edit(d / "projection.json", lambda doc: doc["models"]["llama-1.8b"].update(compute_s=0.9876))
    md = report.render(d)
    sec3 = md.split("## 3.")[1].split("## 4.")[0]
    assert "| scape-99 | 432 |" in sec3 and "against 988 ms of dense compute (FLOPs at MFU" in sec3
    assert "**GPU: skipped by this benchmark**" in sec3 and "| cpu (1 thread) | scape-99 |" in sec3
    sec4 = md.split("## 4.")[1].split("## 5.")[0]
    assert (
        "![break-even map](break_even.png)" in sec4 and "[`break_even.md`](break_even.md)" in sec4
    )
    assert "needs the dense exchange to take at least" in sec4  # the map's summary in words


def test_the_prose_prints_only_figures_read_from_the_files(tmp_path, write_sweep, make_point):
    """Change the figures the notes read; the new ones appear, the old do not, and every
    number in the notes is one of them."""
    d = _bench_copy(tmp_path)
    protocol = {"max_load": 2.75, "max_other_cores": 0.4, "retries": 4}
    write_sweep(d, [make_point("scape-99", 0.11, 0.10, 2.0)], protocol=protocol)
    _edit(d / "projection.json", lambda doc: (doc["assumptions"].update(alpha_us=17.0, world_size=33),
                                              doc["models"]["llama-1.8b"].update(buckets=46)))  # fmt: skip
    notes = report.render(d).split("## Findings and caveats")[1]
    assert "load above 2.75" in notes and "others above 0.4 cores" in notes and "4 re-runs" in notes
    assert "(46 for Llama-1.8B at 33 ranks)" in notes and "at 17 us per ring step" in notes
    assert "1.5" not in notes and "45 for" not in notes and "10 us" not in notes
    numbers = set(re.findall(r"\d+(?:\.\d+)?", notes))
    # beside them only "1-min", "Llama-1.8B" and the section numbers 2 and 3
    assert numbers <= {"1", "1.8", "2", "3", "2.75", "0.4", "4", "46", "33", "17"}, numbers


def test_the_gpu_target_is_met_or_not_only_where_a_gpu_check_calibrated_the_projection(tmp_path):
    d = _bench_copy(tmp_path)
    row = "SCAPE optimizer work <= 10% of dense compute, Llama-1.8B, GPU"

    def scape_share(share: float, cal) -> str:
        def edit(doc: dict) -> None:
            m18 = doc["models"]["llama-1.8b"]
            for method in ("scape-90", "scape-99"):
                m18["scape"][method]["optimizer_s"] = share * m18["compute_s"]
            doc["gpu_calibration"] = cal

        _edit(d / "projection.json", edit)
        return next(line for line in report.render(d).splitlines() if row in line)

    gpu = {"gpu": "Some GPU", "mfu": 0.3125, "file": "x.json", "buckets": 45, "kernels": {}}
    assert scape_share(0.0825, gpu).endswith(
        "| 8.2% (99%), 8.2% (90%): kernels measured on Some GPU (one rank of W=32), compute at its "
        "MFU 31.2% | met |"
    )
    assert scape_share(0.1375, gpu).endswith("| not met |")
    assert scape_share(0.0825, "none: no GPU run yet").endswith(
        "| not measured (no GPU); modeled 8.2% (99%), 8.2% (90%) | unverified |"
    )


def test_the_cpu_ab_line_reads_the_newest_saved_run(tmp_path):
    assert "No CPU A/B" in report.cpu_ab_section(tmp_path)[0]
    rows = [(0, "a", 0.20, 0.3), (0, "b", 0.10, 1.5), (1, "b", 0.12, 1.7), (1, "a", 0.22, 1.8)]
    (tmp_path / "ab_step_old_vs_new.jsonl").write_text("\n".join(
        json.dumps({"round": r, "tree": t, "median_step_s": s, "load_before": lo})
        for r, t, s, lo in rows) + '\n{"a": 0.21, "b": 0.11}\n')  # fmt: skip
    (line,) = report.cpu_ab_section(tmp_path)
    assert "2 rounds" in line and "0.2100 s at old, 0.1100 s at new" in line
    assert "load before the rounds 0.30-1.80" in line
