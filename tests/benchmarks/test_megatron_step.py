"""The Megatron-step harness: its summaries on synthetic rank results, the cost model, resume
and skip records, and real runs of the pretrain stage's engines -- a round in network
namespaces (loopback without root) with each method's compute-only floor beside it, in
PyTorch's fake process group."""

import json
import math

import pytest

from benchmarks import megatron_step as ms
from benchmarks import netns, quiet
from benchmarks.costmodel import AlphaBeta, fit_alpha_beta
from benchmarks.netns import skip_reason

# The machine may be shared (studies, other tests): these check function, not speed.
QUIET_OFF = ["--allow-busy", "--retries", "0", "--settle-s", "0"]
TINY = ["model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=2",
        "model.ffn_hidden_size=128", "train.bucket_size=200000"]  # fmt: skip


def test_plan_has_a_round_per_link_each_with_its_own_floors():
    rounds = ms.plan_rounds("sweep", [2, 4], [100, 1000, 10000])
    assert [r["name"] for r in rounds] == ["w2-100mbit", "w2-1gbit", "w2-10gbit",
                                           "w4-100mbit", "w4-1gbit", "w4-10gbit"]  # fmt: skip
    assert all(r["mode"] == "cluster" and r["floor"] for r in rounds)
    (only,) = ms.plan_rounds("reproduce", [2], [1000])
    assert only["mode"] == "cluster" and only["world_size"] == 2 and only["rate_mbit"] == 1000
    assert not only.get("floor")  # the table needs step times only


def test_calibration_messages_stay_short_on_slow_links():
    slow = ms.calibration_sizes(100, 2)
    assert len(slow) >= 3 and max(slow) / (100e6 / 8) <= ms.CAL_MAX_S
    assert ms.calibration_sizes(10000, 4) == ms.CAL_SIZES


def _rank(rank, secs, info=None, **extra):
    """A rank's result: secs[method] = seconds per step (step 0 is the warm-up)."""
    steps = []
    for m, times in secs.items():
        for i, t in enumerate(times):
            row = {"method": m, "step": i, "measured": i >= 1, "seconds": t,
                   "tx_bytes": 1000.0 * (rank + 1)}  # fmt: skip
            if rank == 0:
                row.update(bytes={"grad_values": 400.0 + i, "param_values": 400.0}, loss=1.0)
            steps.append(row)
    methods = info or {m: {"label": m, "buckets": 1, "overlap_grad_reduce": False,
                           "delay_mask": None} for m in secs}  # fmt: skip
    return {"rank": rank, "methods": methods, "steps": steps, **extra}


def test_a_step_counts_at_its_slowest_rank():
    r0 = _rank(0, {"a": [9.0, 1.0, 1.0, 1.0, 1.0]})
    r1 = _rank(1, {"a": [9.0, 1.0, 3.0, 2.0, 1.0]})
    s = ms.summarize_round([r0, r1], 2)["methods"]["a"]
    assert s["step_s_all"] == [1.0, 3.0, 2.0, 1.0]  # warm-up left out, max over ranks
    assert s["step_s"] == 1.5 and s["n_steps"] == 4
    assert (s["step_s_min"], s["step_s_max"]) == (1.0, 3.0)
    assert s["step_s_p25"] <= s["step_s"] <= s["step_s_p75"]
    assert s["bytes_per_rank"] == {"grad_values": 402.5, "param_values": 400.0}
    assert s["wire_bytes_per_rank"] == 1500.0  # mean over ranks, median over steps


def test_each_method_runs_in_its_own_launches_in_two_mirrored_passes():
    a, b, c = ({"name": n} for n in "abc")
    plan = ms.launch_plan([a, b, c], 5, 3, shared_process=False)
    assert [(lp["methods"][0]["name"], lp["pass"], lp["steps"]) for lp in plan] == [
        ("a", 0, 3), ("b", 0, 3), ("c", 0, 3), ("c", 1, 2), ("b", 1, 2), ("a", 1, 2)]  # fmt: skip
    assert all(len(lp["methods"]) == 1 for lp in plan)
    assert {lp["step_offset"] for lp in plan if lp["pass"] == 1} == {3 + 3}  # after pass 0
    assert len(ms.launch_plan([a, b], 1, 3, shared_process=False)) == 2  # one step: one pass
    assert ms.launch_plan([a, b], 5, 3, shared_process=True) == [
        {"methods": [a, b], "pass": 0, "steps": 5, "step_offset": 0, "mode": None}]  # fmt: skip


def test_each_launch_sits_beside_its_floor_launch_and_the_pairs_mirror():
    a, b = {"name": "a"}, {"name": "b"}
    plan = ms.launch_plan([a, b], 4, 1, shared_process=False, floor=True)
    assert [(lp["methods"][0]["name"], lp["pass"], lp["mode"]) for lp in plan] == [
        ("a", 0, None), ("a", 0, "floor"), ("b", 0, None), ("b", 0, "floor"),
        ("b", 1, "floor"), ("b", 1, None), ("a", 1, "floor"), ("a", 1, None)]  # fmt: skip
    # a floor launch runs the same steps as its partner, so their steps pair one to one
    for steps, floors in zip(plan[::2], plan[1::2], strict=True):
        assert (steps["steps"], steps["step_offset"]) == (floors["steps"], floors["step_offset"])
    shared = ms.launch_plan([a, b], 4, 1, shared_process=True, floor=True)
    assert [lp["mode"] for lp in shared] == [None, "floor"]


def test_launches_merge_into_one_result_per_rank():
    plan = ms.launch_plan([{"name": "d"}, {"name": "s"}], 2, 1, shared_process=False)
    info = {"d": {"optimizer": "adams"}, "s": {"optimizer": "scape"}}
    done = []
    for i, lp in enumerate(plan):
        name = lp["methods"][0]["name"]
        extra = {"fwd_bwd_method": name, "fwd_bwd": [[0.1 * (i + 1), 0.2]],
                 "step_calls": {name: [{"kind": "k", "launch": i}]}}  # fmt: skip
        if i == 0:
            extra["calibration"] = [{"op": "all_reduce", "launch": 0}]
        done.append((lp, [dict(_rank(r, {name: [1.0 + i, 2.0 + i]}, {name: info[name]}), **extra)
                          for r in range(2)]))  # fmt: skip
    merged = ms.merge_launches(done)
    assert len(merged) == 2 and set(merged[1]["methods"]) == {"d", "s"}
    # pass 1's steps come after pass 0's warm-up and measured step: one of each, per method
    assert sorted((r["method"], r["step"]) for r in merged[0]["steps"]) == [
        ("d", 0), ("d", 1), ("d", 2), ("d", 3), ("s", 0), ("s", 1), ("s", 2), ("s", 3)]  # fmt: skip
    assert merged[0]["calibration"] == [{"op": "all_reduce", "launch": 0}]
    assert merged[0]["step_calls"] == {"d": [{"kind": "k", "launch": 0}],
                                       "s": [{"kind": "k", "launch": 1}]}  # fmt: skip
    assert merged[0]["fwd_bwd_method"] == "d" and merged[0]["fwd_bwd"] == [[0.1, 0.2]]
    steps_only = [{k: v for k, v in m.items() if k not in ("calibration", "step_calls")}
                  for m in merged]  # fmt: skip
    summary = ms.summarize_round(steps_only, 2)["methods"]
    assert summary["d"]["step_s_all"] == [2.0, 5.0] and summary["s"]["n_steps"] == 2


def test_passes_that_disagree_mark_the_round_disturbed():
    plan = ms.launch_plan([{"name": "d"}, {"name": "s"}], 4, 1, shared_process=False)
    steady = {"d": {"step_s_all": [8.2, 8.4, 8.3, 8.2]}, "s": {"step_s_all": [0.3, 0.4, 0.4, 0.3]}}
    check = ms.pass_check(steady, plan)
    assert check["pass_medians"]["d"] == [8.3, 8.25] and "disturbed" not in check
    halved = dict(steady, d={"step_s_all": [15.5, 16.0, 8.2, 8.3]})  # pass 0 at half the rate
    assert "d 15.8 s then 8.25 s" in ms.pass_check(halved, plan)["disturbed"]
    shared = ms.launch_plan([{"name": "d"}, {"name": "s"}], 4, 1, shared_process=True)
    assert ms.pass_check(halved, shared) == {}  # one launch: no passes to compare


def test_calibration_is_fitted_on_the_slowest_rank_of_each_repetition():
    link = AlphaBeta(50e-6, 100e6)
    cal = []
    for op in ("reduce_scatter", "all_gather"):
        for n in (1 << 16, 1 << 20, 1 << 23):
            t = (2 - 1) * link.alpha_s + 0.5 * n / link.bandwidth_Bps
            cal.append({"op": op, "nbytes": n, "times": [t, t], "tx_bytes": [None, None]})
    fast = [dict(c, times=[c["times"][0] * 0.5] * 2) for c in cal]
    r0 = _rank(0, {"a": [1.0, 1.0]}, calibration=cal)
    r1 = _rank(1, {"a": [1.0, 1.0]}, calibration=fast)
    fits = ms.summarize_round([r0, r1], 2)["fits"]
    assert fits["all_gather"]["alpha_us"] == pytest.approx(50, rel=1e-6)
    assert fits["reduce_scatter"]["bandwidth_MBps"] == pytest.approx(100, rel=1e-6)


def test_each_methods_own_collectives_are_timed_at_the_slowest_rank_of_each_repetition():
    def calls(times, cpu):
        return {"a": [{"kind": "values", "op": "all_reduce", "tensor_nbytes": 8, "nbytes": 16,
                       "times": times, "cpu_times": cpu, "tx_bytes": [None] * 3}]}  # fmt: skip

    r0 = _rank(0, {"a": [1.0, 1.0]}, step_calls=calls([0.1, 0.5, 0.2], [0.1, 0.2, 0.3]))
    r1 = _rank(1, {"a": [1.0, 1.0]}, step_calls=calls([0.3, 0.1, 0.2], [0.3, 0.0, 0.1]))
    timed = ms.summarize_round([r0, r1], 2)["step_calls"]["a"]["values"]
    assert timed["times"] == [0.3, 0.5, 0.2] and timed["seconds"] == 0.3
    # CPU: the ranks' mean per repetition (0.2, 0.1, 0.2), then the median
    assert timed["cpu_times"] == pytest.approx([0.2, 0.1, 0.2]) and timed["cpu_s"] == 0.2
    assert (timed["op"], timed["nbytes"]) == ("all_reduce", 16)


@pytest.mark.parametrize("world", [2, 4])
def test_a_methods_collectives_are_sized_from_the_bytes_its_engine_counted(world):
    from benchmarks.step_rank import step_calls

    ring = (world - 1) / world  # a ring counts (W-1)/W of each tensor
    dense = {"buckets": 4, "overlap_grad_reduce": True}
    got = step_calls(dense, {"grad_values": 4 * ring * 10e6, "param_values": 4 * ring * 6e6},
                     world)  # fmt: skip
    assert got == [{"kind": "grad_values", "op": "reduce_scatter", "nbytes": 10_000_000},
                   {"kind": "param_values", "op": "all_gather", "nbytes": 6_000_000}]  # fmt: skip
    # SCAPE: one all-reduce of a T-byte tensor per bucket, counted as both of a ring's passes
    scape = {"buckets": 4, "value_collectives": 4, "values_in_grad_sync": True}
    counted = {"grad_values": 4 * ring * 1e5, "param_values": 4 * ring * 1e5, "masks": ring * 5e4}
    assert step_calls(scape, counted, world) == [
        {"kind": "values", "op": "all_reduce", "nbytes": 100_000},
        {"kind": "masks", "op": "all_gather", "nbytes": 50_000}]  # fmt: skip
    assert step_calls(scape, counted, 1) == []


def test_speed_ups_are_same_step_ratios_not_ratios_of_medians():
    rnd = {"methods": {"d": {"step_s_all": [1.0, 4.0, 1.0]}, "o": {"step_s_all": [2.0, 1.0, 3.0]},
                       "s": {"step_s_all": [0.5, 4.0, 0.25]}}}  # fmt: skip
    assert ms.paired_speedup(rnd, "d", "s") == 2.0  # ratios 2, 1, 4
    # against the faster dense at each step: min(1,2)/0.5, min(4,1)/4, min(1,3)/0.25
    assert ms.paired_speedup(rnd, ["d", "o"], "s") == 2.0
    assert ms.paired_speedup(rnd, "missing", "s") is None


FITS = {"reduce_scatter": {"alpha_us": 100.0, "bandwidth_MBps": 50.0},
        "all_gather": {"alpha_us": 100.0, "bandwidth_MBps": 100.0}}  # fmt: skip


def test_model_no_overlap_is_floor_plus_every_collective():
    dense = {"buckets": 1, "overlap_grad_reduce": False, "delay_mask": None,
             "bytes_per_rank": {"grad_values": 50e6, "param_values": 100e6}}  # fmt: skip
    p = ms.predict(dense, 0.1, 0.05, FITS, 2)
    assert p["grad"] == pytest.approx(100e-6 + 1.0) and p["param"] == pytest.approx(100e-6 + 1.0)
    assert p["total"] == pytest.approx(0.1 + 2.0 + 200e-6)


def test_model_hides_reduce_scatters_behind_backward_and_the_delayed_mask_behind_compute():
    m = {"buckets": 4, "overlap_grad_reduce": True, "delay_mask": True,
         "bytes_per_rank": {"grad_values": 5e6, "param_values": 1e6, "masks": 1e6}}  # fmt: skip
    p = ms.predict(m, 0.5, 0.4, FITS, 2)
    grad = 4 * 100e-6 + 0.1
    # 0.3 s of backward would hide all four, but the last starts when backward ends
    assert p["grad"] == pytest.approx(grad / 4)
    assert p["hidden_grad"] == pytest.approx(grad * 3 / 4)
    slow = ms.predict(dict(m, bytes_per_rank=dict(m["bytes_per_rank"], grad_values=50e6)),
                      0.5, 0.4, FITS, 2)  # fmt: skip
    assert slow["hidden_grad"] == pytest.approx(0.75 * 0.4)  # 1 s: hidden up to 3/4 of backward
    assert p["mask"] == 0.0  # 10 ms of masks behind a 0.5 s step
    assert ms.predict(dict(m, delay_mask=False), 0.5, 0.4, FITS, 2)["mask"] > 0


def test_model_hides_scape_all_reduces_behind_backward_unless_fused():
    m = {"buckets": 4, "value_collectives": 4, "overlap_grad_reduce": True, "delay_mask": True,
         "values_in_grad_sync": True,
         "bytes_per_rank": {"grad_values": 1e6, "param_values": 1e6, "masks": 1e6}}  # fmt: skip
    p = ms.predict(m, 0.5, 0.4, FITS, 2)
    values = 4 * 100e-6 + 1e6 / 50e6 + 4 * 100e-6 + 1e6 / 100e6  # both passes, 4 all-reduces
    assert p["hidden_grad"] == pytest.approx(values * 3 / 4)  # all but the last
    assert p["grad"] == pytest.approx(values / 4)
    assert p["param"] == 0.0 and p["mask"] == 0.0  # no parameter all-gather; mask hidden
    fused = ms.predict(dict(m, value_collectives=1), 0.5, 0.4, FITS, 2)  # one, after backward
    assert fused["grad"] == pytest.approx(2 * 100e-6 + 1e6 / 50e6 + 1e6 / 100e6)


def test_model_times_scape_values_by_the_all_reduce_fit_when_the_round_has_one():
    """SCAPE's values travel in all-reduces: with a fit of bare all-reduces (bytes booked as
    the ring's two passes) both halves are timed by it; the mask all-gather keeps the
    all-gather fit, and dense methods never use it."""
    m = {"buckets": 2, "value_collectives": 2, "overlap_grad_reduce": False, "delay_mask": False,
         "values_in_grad_sync": True,
         "bytes_per_rank": {"grad_values": 1e6, "param_values": 1e6, "masks": 2e6}}  # fmt: skip
    fits = {**FITS, "all_reduce": {"alpha_us": 10.0, "bandwidth_MBps": 200.0}}
    p = ms.predict(m, 0.5, 0.4, fits, 2)
    # one all-reduce per bucket: one latency term, as the fit books it (both passes in one)
    assert p["grad"] == pytest.approx(2 * (10e-6 + 1e6 / 200e6))
    assert p["mask"] == pytest.approx(100e-6 + 2e6 / 100e6)
    dense = {"buckets": 1, "overlap_grad_reduce": False, "delay_mask": None,
             "bytes_per_rank": {"grad_values": 50e6, "param_values": 100e6}}  # fmt: skip
    assert ms.predict(dense, 0.1, 0.05, fits, 2) == ms.predict(dense, 0.1, 0.05, FITS, 2)


def test_model_books_each_call_as_timed_at_the_steps_own_size_where_the_round_has_it():
    """A timed collective replaces the fit for its kind alone; the rest keep the fits."""
    dense = {"buckets": 4, "overlap_grad_reduce": False, "delay_mask": None,
             "bytes_per_rank": {"grad_values": 50e6, "param_values": 100e6}}  # fmt: skip
    p = ms.predict(dense, 0.1, 0.05, FITS, 2, {"grad_values": {"seconds": 0.02}})
    assert p["grad"] == pytest.approx(4 * 0.02)
    assert p["param"] == pytest.approx(4 * 100e-6 + 1.0)  # the all-gather fit
    scape = {"buckets": 4, "value_collectives": 4, "overlap_grad_reduce": True,
             "delay_mask": False, "values_in_grad_sync": True,
             "bytes_per_rank": {"grad_values": 1e6, "param_values": 1e6, "masks": 1e6}}  # fmt: skip
    q = ms.predict(
        scape, 0.5, 0.4, FITS, 2, {"values": {"seconds": 0.2}, "masks": {"seconds": 0.01}}
    )
    assert q["grad"] == pytest.approx(4 * 0.2 - 0.3) and q["mask"] == 0.01
    assert q["total"] == pytest.approx(0.5 + 0.5 + 0.01)


def test_model_books_the_cpu_time_of_hidden_calls_as_displaced_compute_on_full_cores():
    """What a call hides is not free when the ranks fill the cores: its CPU share, measured
    bare, times the hidden seconds, spread over the cores. Exposed calls, untimed calls and
    ranks that leave cores free book nothing."""
    dense = {"buckets": 4, "overlap_grad_reduce": True, "delay_mask": None,
             "bytes_per_rank": {"grad_values": 50e6, "param_values": 100e6}}  # fmt: skip
    timed = {"grad_values": {"seconds": 0.02, "cpu_s": 0.015},
             "param_values": {"seconds": 0.03, "cpu_s": 0.03}}  # fmt: skip
    free = ms.predict(dense, 0.1, 0.4, FITS, 2, timed)
    assert free["hidden_grad"] == pytest.approx(3 * 0.02) and free["displaced"] == 0.0
    full = ms.predict(dense, 0.1, 0.4, FITS, 2, timed, cores=2)
    assert full["displaced"] == pytest.approx(3 * 0.02 * 0.75)  # the all-gather is exposed
    assert full["total"] == pytest.approx(free["total"] + 0.045)
    # 4 ranks on 2 cores: each core carries two ranks' hidden CPU time
    four = ms.predict(dense, 0.1, 0.4, FITS, 4, timed, cores=2)
    assert four["displaced"] == pytest.approx(2 * four["hidden_grad"] * 0.75)
    assert ms.predict(dense, 0.1, 0.4, FITS, 2, timed, cores=8)["displaced"] == 0.0
    assert ms.predict(dense, 0.1, 0.4, FITS, 2, None, cores=2)["displaced"] == 0.0  # untimed
    over = {"grad_values": {"seconds": 0.02, "cpu_s": 0.05}}  # two threads: capped at 1
    assert ms.predict(dense, 0.1, 0.4, FITS, 2, over, cores=2)["displaced"] == pytest.approx(0.06)
    # SCAPE: its values' all-reduces hidden behind backward and its masks behind the step
    scape = {"buckets": 2, "value_collectives": 2, "overlap_grad_reduce": True,
             "delay_mask": True, "values_in_grad_sync": True,
             "bytes_per_rank": {"grad_values": 1e6, "param_values": 1e6, "masks": 1e6}}  # fmt: skip
    q = ms.predict(scape, 0.5, 0.4, FITS, 2,
                   {"values": {"seconds": 0.1, "cpu_s": 0.05},
                    "masks": {"seconds": 0.01, "cpu_s": 0.01}}, cores=2)  # fmt: skip
    assert q["hidden_grad"] == pytest.approx(0.1) and q["mask"] == 0.0
    assert q["displaced"] == pytest.approx(0.1 * 0.5 + 0.01 * 1.0)


def _round(name, w, methods, **extra):
    return {"name": name, "mode": "floor" if name.startswith("floor") else "cluster",
            "world_size": w, "link": {"label": "1gbit", "rate_mbit": 1000.0},
            "methods": methods, **extra}  # fmt: skip


def _m(steps, **kw):
    return {"label": "x", "step_s": sorted(steps)[len(steps) // 2], "step_s_all": steps,
            "step_s_p25": min(steps), "step_s_p75": max(steps), "step_s_min": min(steps),
            "step_s_max": max(steps), "n_steps": len(steps), "bytes_per_rank_total": 8.0,
            "wire_bytes_per_rank": 12.0, "buckets": 1, "overlap_grad_reduce": False,
            "delay_mask": None, "bytes_per_rank": {"grad_values": 4e6, "param_values": 4e6}, **kw}  # fmt: skip


def test_points_join_each_round_with_its_floor_and_model():
    floor = _round("floor-w2", 2, {"dense-no-overlap": _m([0.1, 0.1, 0.1]),
                                   "dense-overlap": _m([0.1, 0.1, 0.1]),
                                   "scape-99": _m([0.2, 0.2, 0.2])},
                   fwd_bwd={"backward_s": 0.05}, quiet={"noisy": False})  # fmt: skip
    cl = _round("w2-1gbit", 2, {"dense-no-overlap": _m([0.5, 0.5, 0.5]),
                                "dense-overlap": _m([0.4, 0.4, 0.4]),
                                "scape-99": _m([0.25, 0.25, 0.25])},
                fits=FITS, quiet={"load_before": 0.2, "load_after": 1.1, "noisy": False})  # fmt: skip
    pts = {p["method"]: p for p in ms.sweep_points({"floor-w2": floor, "w2-1gbit": cl})}
    d, s = pts["dense-no-overlap"], pts["scape-99"]
    assert d["floor_s"] == 0.1 and d["comm_over_compute"] == pytest.approx(4.0)
    assert s["step_over_floor"] == pytest.approx(1.25) and not s["floor_in_round"]
    # a round's own floors, measured beside its steps, come before another round's
    own = dict(cl, floor={"methods": {m: _m([0.05] * 3) for m in cl["methods"]},
                          "fwd_bwd": {"backward_s": 0.02}})  # fmt: skip
    pts_own = {p["method"]: p for p in ms.sweep_points({"floor-w2": floor, "w2-1gbit": own})}
    assert pts_own["scape-99"]["floor_s"] == 0.05 and pts_own["scape-99"]["floor_in_round"]
    assert pts_own["dense-no-overlap"]["predicted"]["floor"] == 0.05
    assert s["speedup_vs_dense-no-overlap"] == 2.0 and s["speedup_vs_dense-overlap"] == 1.6
    assert s["speedup_vs_best_dense"] == 1.6
    want = ms.predict(cl["methods"]["dense-no-overlap"], 0.1, 0.05, FITS, 2)["total"]
    assert d["model_error"] == pytest.approx(want / 0.5 - 1)
    assert (d["load_before"], d["load_after"], d["noisy"]) == (0.2, 1.1, False)


def test_an_unfinished_run_resumes_only_its_quiet_rounds_at_the_same_fingerprint(tmp_path):
    out = tmp_path / "m.json"
    fp = {"commit": "abc", "uncommitted": "0", "settings": "s"}
    rounds = {"floor-w2": {"quiet": {"noisy": False}}, "w2-1gbit": {"quiet": {"noisy": True}},
              "w2-10gbit": {"error": "rank 1 exited"}}  # fmt: skip
    out.write_text(json.dumps({"fingerprint": fp, "complete": False, "rounds": rounds,
                               "started_at": "then"}))  # fmt: skip
    assert ms._resumable(out, fp, fresh=False) == ({"floor-w2": rounds["floor-w2"]}, "then")
    assert ms._resumable(out, fp, fresh=True) == ({}, None)
    assert ms._resumable(out, dict(fp, commit="def"), fresh=False) == ({}, None)
    out.write_text(json.dumps({"fingerprint": fp, "complete": True, "rounds": rounds}))
    assert ms._resumable(out, fp, fresh=False) == ({}, None)  # a finished run: measured again
    # ... unless only its noisy and failed rounds are to be run again
    assert list(ms._resumable(out, fp, fresh=False, rerun_noisy=True)[0]) == ["floor-w2"]
    assert ms._resumable(out, dict(fp, settings="t"), False, rerun_noisy=True) == ({}, None)


@pytest.mark.parametrize("suite", ["sweep", "reproduce"])
def test_without_namespaces_a_skip_record_says_why(monkeypatch, tmp_path, suite):
    from pipelines.efficiency import read_step_times

    monkeypatch.setattr(netns, "skip_reason", lambda: "not root: test")
    out = tmp_path / "steptime.json"
    assert ms.main(["--suite", suite, "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"skipped": "not root: test"}
    points, note = read_step_times(out)
    assert points == {} and "skipped (not root: test)" in note


def test_beside_a_study_it_refuses_or_records_why(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "skip_reason", lambda: None)
    monkeypatch.setattr(netns, "remove_stale", lambda: [])
    monkeypatch.setattr(
        quiet, "busy_processes", lambda: [(4242, "python -m pipelines.quality_study")]
    )
    out = tmp_path / "steptime.json"
    with pytest.raises(SystemExit, match="refusing to time beside pid 4242"):
        ms.main(["--out", str(out)])
    assert ms.main(["--suite", "reproduce", "--on-busy", "skip", "--out", str(out)]) == 0
    assert "pid 4242" in json.loads(out.read_text())["skipped"]


def test_a_reproduce_run_that_dies_leaves_no_stale_step_times(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "skip_reason", lambda: None)
    monkeypatch.setattr(netns, "remove_stale", lambda: [])
    monkeypatch.setattr(quiet, "busy_processes", lambda: [])

    def boom(*_):
        raise RuntimeError("a rank could not start")

    monkeypatch.setattr(ms, "plan_rounds", boom)
    out = tmp_path / "steptime.json"
    out.write_text(json.dumps({"points": [{"experiment": "e", "optimizer": "AdamS"}]}))
    with pytest.raises(RuntimeError):
        ms.main(["--suite", "reproduce", "--out", str(out)])
    assert "did not finish" in json.loads(out.read_text())["skipped"]


def _mode():
    return [] if skip_reason() is None else ["--loopback"]


def test_sweep_floor_and_link_rounds_through_the_pretrain_engines(tmp_path, prepared_default):
    out = tmp_path / "m.json"
    # one measured step of two methods (4 launches: the suite must stay under 15 min on a
    # slow host); two passes and their merge are checked on synthetic launches above
    argv = ["--worlds", "2", "--rates-mbit", "1000", "--steps", "1", "--warmup", "1",
            "--methods", "dense-no-overlap", "scape-99", "--model-overrides", *TINY,
            "--timeout", "400", "--out", str(out), *QUIET_OFF, *_mode()]  # fmt: skip
    assert ms.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] and list(doc["rounds"]) == ["w2-1gbit"]
    link = doc["rounds"]["w2-1gbit"]
    assert "error" not in link, link.get("error")
    assert link["quiet"]["load_before"] >= 0 and len(link["quiet"]["attempts"]) == 1
    floor = link["floor"]  # each method's floor launch, beside its launch on the link
    assert link["launches"] == 2 * 2  # one pass x (steps, floor) x 2 methods
    for rnd in (floor, link):
        assert set(rnd["methods"]) == {"dense-no-overlap", "scape-99"}
        assert all(e["n_steps"] == 1 for e in rnd["methods"].values())
    assert floor["fwd_bwd"]["backward_s"] > 0 and "calibration" not in floor
    assert "step_calls" not in floor
    m = link["methods"]
    # the pretrain configs, as built: Megatron uses one bucket without the overlap
    assert m["dense-no-overlap"]["buckets"] == 1 and m["scape-99"]["buckets"] > 1
    assert m["scape-99"]["overlap_grad_reduce"] and m["scape-99"]["delay_mask"]
    assert m["scape-99"]["label"] == "SCAPE-99" and m["dense-no-overlap"]["label"] == "AdamS"
    n = m["dense-no-overlap"]["n_params"]
    # dense ZeRO-1 on CPU: fp32 grads reduce-scattered, fp32 params all-gathered, W=2
    assert m["dense-no-overlap"]["bytes_per_rank"]["grad_values"] >= 4 * n / 2
    dense_total = m["dense-no-overlap"]["bytes_per_rank_total"]
    assert m["scape-99"]["bytes_per_rank_total"] < dense_total / 20
    for e in m.values():
        assert e["n_steps"] == 1 and all(t > 0 and math.isfinite(t) for t in e["step_s_all"])
    # each method's own collectives, timed bare at its step's sizes (what the model books)
    calls = link["step_calls"]
    assert set(calls["scape-99"]) == {"values", "masks"}
    assert set(calls["dense-no-overlap"]) == {"grad_values", "param_values"}
    ring = 1 / 2  # counted: (W-1)/W of each tensor; an all-reduce's tensor booked twice
    assert calls["dense-no-overlap"]["grad_values"]["nbytes"] == pytest.approx(
        m["dense-no-overlap"]["bytes_per_rank"]["grad_values"] / ring, rel=1e-3
    )
    values = m["scape-99"]["bytes_per_rank"]["grad_values"] * 2 / m["scape-99"]["buckets"]
    assert calls["scape-99"]["values"]["nbytes"] == pytest.approx(values / ring, rel=1e-2)
    assert all(c["seconds"] > 0 for kinds in calls.values() for c in kinds.values())
    assert all(c["cpu_s"] >= 0 for kinds in calls.values() for c in kinds.values())
    assert link["cores"] >= 1  # the model books displaced compute against them
    pts = {p["method"]: p for p in doc["points"]}
    assert set(pts) == set(m) and all(p["floor_s"] > 0 for p in pts.values())
    assert all(p["floor_in_round"] for p in pts.values())
    assert pts["scape-99"]["speedup_vs_dense-no-overlap"] > 0
    if skip_reason() is None:  # shaped namespaces: the interfaces' bytes and the model
        wire = (
            m["dense-no-overlap"]["wire_bytes_per_rank"]
            / m["dense-no-overlap"]["bytes_per_rank_total"]
        )
        assert 0.9 < wire < 2.2  # gloo's reduce-scatter sends up to twice the ring's bytes
        assert "fits" in link or "fit_error" in link
        if "fits" in link:
            assert all("model_error" in p for p in pts.values())


def test_reproduce_suite_feeds_the_efficiency_table(tmp_path, prepared_default):
    from pipelines.efficiency import read_step_times

    out = tmp_path / "steptime.json"
    exp = "gpt345m_owt_quality"  # one of the table's experiments (2 launches, not 4)
    argv = ["--suite", "reproduce", "--steps", "1", "--warmup", "1", "--methods", f"{exp}/adams",
            f"{exp}/scape99", "--timeout", "400", "--out", str(out), *QUIET_OFF, *_mode()]  # fmt: skip
    assert ms.main(argv) == 0
    doc = json.loads(out.read_text())
    points, note = read_step_times(out)
    if skip_reason() is not None:  # loopback: never a speed measure for the table
        assert points == {} and "loopback run" in note and len(doc["loopback_points"]) == 2
        return
    assert set(points) == {(exp, "AdamS"), (exp, "SCAPE-99")}
    for (_, label), p in points.items():
        assert p["step_s"] > 0 and p["link"] == "1gbit" and p["world_size"] == 2
        assert (p["speedup_vs_reference"] == 1.0) == (label == "AdamS")
    assert "2 ranks" in note and "1gbit" in note


def test_alpha_beta_fit_recovers_a_known_link():  # the fit the model uses, for the record
    link = AlphaBeta(20e-6, 1e9)
    pts = [(4, n, 3 * link.alpha_s + 0.75 * n / link.bandwidth_Bps) for n in (1e4, 1e6, 1e8)]
    got = fit_alpha_beta(pts)
    assert got.alpha_s == pytest.approx(20e-6) and got.bandwidth_Bps == pytest.approx(1e9)
