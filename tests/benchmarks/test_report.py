"""results/bench/README.md's section 2 and targets, rendered from a synthetic harness JSON: every
figure with its round's load, noisy rounds flagged, targets judged from the points."""

import json

from benchmarks import report


def _point(w, method, step, floor, best, off, on, err=0.05, noisy=False):
    return {"round": f"w{w}-1gbit", "world_size": w, "link": "1gbit", "rate_mbit": 1000.0,
            "method": method, "label": method, "step_s": step, "step_s_p25": step * 0.9,
            "step_s_p75": step * 1.1, "floor_s": floor, "step_over_floor": step / floor,
            "comm_over_compute": step / floor - 1, "bytes_per_rank": 1e6,
            "wire_bytes_per_rank": 1.4e6, "speedup_vs_best_dense": best,
            "speedup_vs_dense-no-overlap": off, "speedup_vs_dense-overlap": on,
            "predicted": {"total": step * (1 + err)}, "model_error": err,
            "load_before": 0.31, "load_after": 1.72, "noisy": noisy,
            "floor_noisy": False}  # fmt: skip


def _doc(points):
    methods = {m: {"model": "bench_llama", "n_params": 10_227_072, "tokens_per_rank_step": 16,
                   "buckets": 1 if m == "dense-no-overlap" else 4, "step_s": 0.1,
                   "step_s_p25": 0.09, "step_s_p75": 0.11}
               for m in ("dense-no-overlap", "dense-overlap", "scape-99")}  # fmt: skip
    rounds = {
        "floor-w2": {"mode": "floor", "world_size": 2, "methods": methods, "seconds": 30,
                     "fwd_bwd": {"forward_s": 0.02, "backward_s": 0.04},
                     "quiet": {"load_before": 0.2, "load_after": 1.9, "noisy": False,
                               "attempts": [{}]}},
        "w2-1gbit": {"mode": "cluster", "world_size": 2, "methods": methods, "seconds": 60,
                     "fits": {**{op: {"alpha_us": 80.0, "bandwidth_MBps": 110.0}
                                 for op in ("reduce_scatter", "all_gather")},
                              "all_reduce": {"alpha_us": 40.0, "bandwidth_MBps": 220.0}},
                     "step_calls": {"scape-99": {"values": {
                         "op": "all_reduce", "nbytes": 204800, "times": [0.003, 0.005, 0.004],
                         "seconds": 0.004, "cpu_s": 0.002}}},
                     "quiet": {"load_before": 0.31, "load_after": 1.72, "other_cores": 0.02,
                               "host_ms_before": 41.2, "host_ms_after": 44.8,
                               "noisy": False, "attempts": [{}, {}]}},
    }  # fmt: skip
    return {"suite": "sweep", "mode": "netns", "complete": True, "steps": 10, "warmup": 3,
            "started_at": "2026-12-01", "bench_model": ["train.bucket_size=2500000"],
            "rounds": rounds, "points": points}  # fmt: skip


def test_section_2_and_the_targets_from_the_harness_json(tmp_path):
    points = [
        _point(2, "dense-no-overlap", 0.50, 0.10, 1.0, 1.0, 0.8),
        _point(2, "scape-99", 0.11, 0.10, 5.2, 5.5, 5.2),
        _point(4, "scape-99", 0.30, 0.20, 2.9, 3.1, 2.9, err=0.30, noisy=True),
    ]
    (tmp_path / "megatron_step.json").write_text(json.dumps(_doc(points)))
    md = report.render(tmp_path)
    sec2 = md.split("## 2.")[1].split("## 3.")[0]
    assert "| 2 x 1gbit | scape-99 | 110 [99-121] | 100 | 1.10 | x5.20 / x5.50 / x5.20 |" in sec2
    assert "0.31 / 1.72 |" in sec2 and "0.31 / 1.72 **noisy** |" in sec2  # 4-rank row noisy
    assert "| floor-w2 | scape-99 | 100 [90-110] | 20 | 40 | 0.20 / 1.90 | 30 |" in sec2  # floor
    assert "in one floor round per rank count" in sec2
    assert (
        "| w2-1gbit | 80 | 110 | 80 | 110 | 40 | 220 | 0.02 | 2 | 0.31 / 1.72 | 41 / 45 | 60 |"
        in sec2
    )
    # what the model booked per call, timed at the step's own size
    assert "| w2-1gbit | scape-99 | values | all_reduce | 204.8 | 4 | 2 | 3, 5, 4 |" in sec2
    assert "`train.bucket_size=2500000` (buckets per step: dense-no-overlap 1" in sec2
    targets = md.split("## Targets")[1].split("## 1.")[0]
    assert "| 2 ranks, 1 Gbit/s: SCAPE-99 >= x5 faster than dense AdamS | x5.20 " in targets
    # the ceiling: the (only) dense step over SCAPE-99's own floor, 0.50 / 0.10
    assert "; at most x5.00 with a free exchange" in targets
    row4 = next(ln for ln in targets.splitlines() if ln.startswith("| 4 ranks"))
    assert row4.endswith("| not met (noisy) |") and "x2.90" in row4
    assert "| 1.10x (110 ms / 100 ms) | met |" in targets  # step within 1.25x its floor
    assert "2/3 within; worst 30% (4 x 1gbit scape-99) | not met |" in targets
    assert "SCAPE-90 >= x2.5 | not measured" in targets


def test_section_2_says_how_the_methods_shared_processes(tmp_path):
    doc = _doc([_point(2, "scape-99", 0.11, 0.10, 5.2, 5.5, 5.2)])
    (tmp_path / "megatron_step.json").write_text(json.dumps(doc))
    assert "methods interleaved step by step in one launch" in report.render(tmp_path)
    doc["settings"] = {"shared_process": False}
    (tmp_path / "megatron_step.json").write_text(json.dumps(doc))
    md = report.render(tmp_path)
    assert "each method in rank processes of its own" in md and "interleaved" not in md


def test_missing_or_skipped_harness_says_so(tmp_path):
    assert "Not measured yet: `make bench-step`" in report.render(tmp_path)
    (tmp_path / "megatron_step.json").write_text(json.dumps({"skipped": "not root: x"}))
    md = report.render(tmp_path)
    assert "**Skipped:** not root: x" in md and "Not rendered yet: `make bench-break-even`" in md


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
    md = report.render(tmp_path)
    sec1 = md.split("## 1.")[1].split("## 2.")[0]
    assert "| scape-99 | 52.0 | 52.0 | 13.0 | 117.0 | 88.9 | 1.12 | = |" in sec1
    assert "| scape-99-bf16 |" in sec1 and "| dense-adams |" in sec1
    targets = md.split("## Targets")[1].split("## 1.")[0]
    row99 = next(ln for ln in targets.splitlines() if "99% sparsity" in ln)
    assert "with bf16 values" in row99 and "counters match the formula" in row99
    assert row99.endswith("| met with bf16 values |")  # fp32 values: 1/44, below 1/60
    (tmp_path / "bytes.json").write_text(json.dumps({"measured": {"methods": {}}}))
    assert "older SCAPE step" in report.render(tmp_path)


def _overhead_doc(total_s: float, commit: str) -> dict:
    from benchmarks.overhead import SCAPE_STEP

    parts = {"scape.pack": total_s / 2, "scape.commit": total_s / 2, "dense.update": 0.004}
    method = {"median_s": parts, "scape_total_s": total_s, "dense_total_s": 0.004,
              "scape_over_dense_total": total_s / 0.004,
              "per_step_s": {"llama-1.8b": {"scape": total_s * 45}}}  # fmt: skip
    return {"scape_step": SCAPE_STEP, "commit": commit, "world_size": 32, "bucket": 40_000_000,
            "shard": 1_250_000, "buckets_per_model": {"llama-1.8b": 45},
            "devices": {"cpu": {"name": "cpu", "scape-90": method, "scape-99": method}}}  # fmt: skip


def test_overhead_section_shows_the_earlier_commit_below_the_current():
    from benchmarks.report import overhead_section

    lines, _ = overhead_section(
        _overhead_doc(0.674, "new1234"), None, _overhead_doc(2.908, "old5678")
    )
    text = "\n".join(lines)
    assert text.index("674 (pack 337") < text.index("at commit old5678") < text.index("2908 (pack")
    alone = "\n".join(overhead_section(_overhead_doc(0.674, "new1234"), None)[0])
    assert "before the CPU-work cut" not in alone


def test_peers_section_puts_the_current_steps_sweep_above_the_first(tmp_path):
    """The re-run with the library's step leads; the first sweep follows with its loads."""
    (tmp_path / "peers.md").write_text("| method | loss |\n|---|---|\n| SCAPE-99 | 7.42 |\n")
    doc = {"link": {"label": "1gbit"}, "runs": [{"loadavg": [0.6, 2.7]}]}
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    assert "7.42" in "\n".join(report.peers_section(tmp_path))
    (tmp_path / "r6").mkdir()
    (tmp_path / "r6" / "peers.md").write_text("| method | loss |\n|---|---|\n| SCAPE-99 | 7.08 |\n")
    text = "\n".join(report.peers_section(tmp_path))
    assert text.index("7.08") < text.index("previous step (R0)") < text.index("7.42")
    assert "1gbit: 0.6-2.7" in text


def test_floors_measured_inside_a_round_are_shown_with_that_round(tmp_path):
    doc = _doc([_point(2, "scape-99", 0.11, 0.10, 5.2, 5.5, 5.2)])
    legacy = doc["rounds"].pop("floor-w2")
    doc["rounds"]["w2-1gbit"]["floor"] = {"methods": legacy["methods"],
                                          "fwd_bwd": {"forward_s": 0.03, "backward_s": 0.05}}  # fmt: skip
    (tmp_path / "megatron_step.json").write_text(json.dumps(doc))
    sec2 = report.render(tmp_path).split("## 2.")[1].split("## 3.")[0]
    assert "| w2-1gbit | scape-99 | 100 [90-110] | 30 | 50 | 0.31 / 1.72 | 60 |" in sec2
    assert "Each round measures its own floors" in sec2 and "floor round" not in sec2


def test_every_committed_sweep_gets_a_row_oldest_first_with_its_host_probe(tmp_path):
    def sweep(started, commit, dense, scape99, scape99_floor):
        points = [_point(2, "dense-no-overlap", dense, 0.15, 1.0, 1.0, 0.9),
                  _point(2, "scape-99", scape99, scape99_floor, dense / scape99, 1.0, 1.0),
                  _point(4, "scape-99", 0.4, 0.3, 2.5, 2.5, 2.5)]  # fmt: skip
        doc = _doc(points)
        doc.update(started_at=started, fingerprint={"commit": commit})
        return doc

    new = sweep("2026-12-02 09:00:00 UTC", "9b3cba2aaaa", 0.60, 0.20, 0.16)
    new["settings"] = {"shared_process": False}
    new["rounds"]["w2-1gbit"]["floor"] = new["rounds"].pop("floor-w2")
    old = sweep("2026-12-01 01:00:00 UTC", "a5fbe06bbbb", 0.70, 0.35, 0.30)
    del old["rounds"]["w2-1gbit"]["quiet"]["host_ms_before"]  # runs before the probe: none
    del old["rounds"]["w2-1gbit"]["quiet"]["host_ms_after"]
    (tmp_path / "megatron_step.json").write_text(json.dumps(new))
    assert "Every committed run" not in report.render(tmp_path)  # one run: nothing to compare
    (tmp_path / "megatron_step_a5fbe06.json").write_text(json.dumps(old))
    (tmp_path / "megatron_step_partial.json").write_text(json.dumps({"rounds": {}}))  # no points
    sec2 = report.render(tmp_path).split("## 2.")[1].split("## 3.")[0]
    rows = [ln for ln in sec2.splitlines() if ln.startswith("| `megatron_step")]
    assert rows == [
        "| `megatron_step_a5fbe06.json` | a5fbe06 | 2026-12-01 01:00:00 UTC | one launch | "
        "own round | - | 150 / 300 | 700 / 350 | x2.00 | x2.50 | - | x2.33 |",
        "| `megatron_step.json` | 9b3cba2 | 2026-12-02 09:00:00 UTC | own launches | "
        "in each round | 43 [41-45] | 150 / 160 | 600 / 200 | x3.00 | x2.50 | - | x3.75 |",
    ]


def test_the_model_column_shows_displaced_compute_and_the_target_the_model_without_it(tmp_path):
    hidden = _point(2, "dense-overlap", 0.50, 0.10, 1.0, 1.0, 1.0, err=0.04)
    hidden["predicted"]["displaced"] = 0.1  # without it the model is 0.42: -16%
    points = [hidden, _point(2, "scape-99", 0.11, 0.10, 4.5, 4.5, 4.5, err=-0.02)]
    (tmp_path / "megatron_step.json").write_text(json.dumps(_doc(points)))
    md = report.render(tmp_path)
    assert "| 520 (+4%) | 100 | 0.31 / 1.72 |" in md  # model, of which displaced
    assert "| 108 (-2%) | - | 0.31 / 1.72 |" in md  # a point with no displaced term
    assert ("2/2 within; worst 4% (2 x 1gbit dense-overlap); without the displaced-compute "
            "term 1/2, worst 16% | met |") in md  # fmt: skip


def test_floor_parts_are_shown_in_section_3_with_what_is_left_of_the_step(tmp_path):
    parts = {"scape.pack": 0.04, "scape.commit": 0.025, "scape.update": 0.084,
             "scape.select": 0.048}  # fmt: skip
    doc = {"world_size": 2, "steps": 10, "warmup": 3, "started_at": "2026-12-02 09:47:45 UTC",
           "quiet": {"load_before": 1.41, "load_after": 1.88, "host_ms_before": 33.2,
                     "host_ms_after": 32.9},
           "methods": {"scape-99": {"step_s": 0.316, "forward_s": 0.04, "backward_s": 0.063,
                                    "parts_s": parts}}}  # fmt: skip
    assert "bench-floor-parts" not in report.render(tmp_path)  # no file: no table
    (tmp_path / "floor_parts.json").write_text(json.dumps(doc))
    sec3 = report.render(tmp_path).split("## 3.")[1].split("## 4.")[0]
    assert "load 1.41 / 1.88, host probe 33 / 33 ms" in sec3
    assert "| scape-99 | 316 | 40 | 63 | 40 | 25 | 84 | 48 | 16 |" in sec3  # rest: 316 - 300
