"""The Megatron-step harness: its summaries on synthetic rank results, the cost model, the
records' (de)serializer, the skip and busy records, and real runs of the pretrain stage's
engines -- a round in network namespaces (loopback without root) with each method's
compute-only floor in PyTorch's fake process group, and the floor by part."""

import dataclasses
import json
import math

import pytest

from benchmarks import megatron_step as ms
from benchmarks.harness import netns, quiet
from benchmarks.harness.netns import skip_reason
from benchmarks.harness.records import Call, MethodSteps, Quiet, Round, Sweep, from_json
from benchmarks.harness.step import slowest_calls, step_calls, summarize

# The machine may be shared (studies, other tests): these check function, not speed.
QUIET_OFF = ["--allow-busy", "--retries", "0", "--settle-s", "0"]
TINY = ["model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=2",
        "model.ffn_hidden_size=128", "train.bucket_size=200000"]  # fmt: skip
INFO = {"label": "x", "optimizer": "adams", "model": "m", "n_params": 10, "buckets": 1,
        "value_collectives": 1, "overlap_grad_reduce": False, "values_in_grad_sync": False,
        "tokens_per_rank_step": 16}  # fmt: skip


def _rank(rank, secs, **extra):
    """A rank's result: secs[method] = seconds per step (step 0 is the warm-up)."""
    steps = []
    for m, times in secs.items():
        for i, t in enumerate(times):
            row = {"method": m, "step": i, "measured": i >= 1, "seconds": t}
            if rank == 0:
                row.update(bytes={"grad_values": 400.0 + i, "param_values": 400.0}, loss=1.0)
            steps.append(row)
    return {"rank": rank, "methods": {m: dict(INFO, label=m) for m in secs}, "steps": steps,
            **extra}  # fmt: skip


def _m(steps, **kw):
    return MethodSteps(**{**INFO, "step_s_all": steps, "bytes_per_rank": {"grad_values": 4e6},
                          **kw})  # fmt: skip


def test_a_step_counts_at_its_slowest_rank():
    r0 = _rank(0, {"a": [9.0, 1.0, 1.0, 1.0, 1.0]})
    r1 = _rank(1, {"a": [9.0, 1.0, 3.0, 2.0, 1.0]})
    s = summarize([r0, r1])["a"]
    assert s.step_s_all == [1.0, 3.0, 2.0, 1.0]  # warm-up left out, max over ranks
    assert s.step_s == 1.5 and s.quartiles == (1.0, 2.25)  # inclusive quartiles
    assert s.bytes_per_rank == {"grad_values": 402.5, "param_values": 400.0}  # rank 0, median
    assert s.label == "a" and s.loss_last == 1.0


def test_each_methods_collectives_are_timed_at_the_slowest_rank_of_each_repetition():
    def calls(times):
        return {"a": [{"kind": "values", "op": "all_reduce", "nbytes": 16, "times": times}]}

    (c,) = slowest_calls([_rank(0, {}, calls=calls([0.1, 0.5, 0.2])),
                             _rank(1, {}, calls=calls([0.3, 0.1, 0.2]))])["a"]  # fmt: skip
    assert c == Call("values", "all_reduce", 16, [0.3, 0.5, 0.2]) and c.seconds == 0.3


@pytest.mark.parametrize("world", [2, 4])
def test_a_methods_collectives_are_sized_from_the_bytes_its_engine_counted(world):
    ring = (world - 1) / world  # a ring counts (W-1)/W of each tensor
    dense = dict(INFO, value_collectives=4)
    got = step_calls(dense, {"grad_values": 4 * ring * 10e6, "param_values": 4 * ring * 6e6},
                     world)  # fmt: skip
    assert got == [{"kind": "grad_values", "op": "reduce_scatter", "nbytes": 10_000_000},
                   {"kind": "param_values", "op": "all_gather", "nbytes": 6_000_000}]  # fmt: skip
    # SCAPE: one all-reduce of a T-byte tensor per bucket, counted as both of a ring's passes
    scape = dict(INFO, value_collectives=4, values_in_grad_sync=True)
    counted = {"grad_values": 4 * ring * 1e5, "param_values": 4 * ring * 1e5, "masks": ring * 5e4}
    assert step_calls(scape, counted, world) == [
        {"kind": "values", "op": "all_reduce", "nbytes": 100_000},
        {"kind": "masks", "op": "all_gather", "nbytes": 50_000}]  # fmt: skip
    assert step_calls(scape, counted, 1) == []


def test_speed_ups_are_same_step_ratios_not_ratios_of_medians():
    rnd = Round("r", 2, "1gbit", 1000.0, methods={"d": _m([1.0, 4.0, 1.0]),
                                                  "o": _m([2.0, 1.0, 3.0]),
                                                  "s": _m([0.5, 4.0, 0.25])})  # fmt: skip
    assert ms.paired_speedup(rnd, ["d"], "s") == 2.0  # ratios 2, 1, 4
    # against the faster dense at each step: min(1,2)/0.5, min(4,1)/4, min(1,3)/0.25
    assert ms.paired_speedup(rnd, ["d", "o"], "s") == 2.0
    assert ms.paired_speedup(rnd, ["missing"], "s") is None


def _calls(**seconds):
    return [Call(kind, "op", 1, [s]) for kind, s in seconds.items()]


def test_model_without_overlap_is_floor_plus_every_call():
    dense = _m([1.0], value_collectives=4)
    p = ms.predict(dense, 0.1, 0.05, _calls(grad_values=0.02, param_values=0.03))
    assert p["grad"] == pytest.approx(4 * 0.02) and p["param"] == pytest.approx(4 * 0.03)
    assert p["total"] == pytest.approx(0.1 + 0.08 + 0.12) and p["hidden_grad"] == 0.0


def test_model_hides_the_gradient_sync_behind_backward_all_but_the_last_call():
    dense = _m([1.0], value_collectives=4, overlap_grad_reduce=True)
    p = ms.predict(dense, 0.5, 0.4, _calls(grad_values=0.02, param_values=0.03))
    # 0.3 s of backward would hide all four, but the last starts when backward ends
    assert p["grad"] == pytest.approx(0.02) and p["hidden_grad"] == pytest.approx(0.06)
    slow = ms.predict(dense, 0.5, 0.4, _calls(grad_values=0.25))
    assert slow["hidden_grad"] == pytest.approx(0.75 * 0.4)  # hidden up to 3/4 of backward
    assert slow["grad"] == pytest.approx(1.0 - 0.3)


def test_model_hides_scapes_masks_behind_the_step_and_has_no_parameter_all_gather():
    scape = _m([1.0], value_collectives=4, overlap_grad_reduce=True, values_in_grad_sync=True)
    p = ms.predict(scape, 0.5, 0.4, _calls(values=0.2, masks=0.01))
    assert p["grad"] == pytest.approx(4 * 0.2 - 0.3) and p["param"] == 0.0 and p["mask"] == 0.0
    assert p["total"] == pytest.approx(0.5 + 0.5)
    assert ms.predict(scape, 0.005, 0.4, _calls(masks=0.01))["mask"] == pytest.approx(0.005)
    fused = ms.predict(_m([1.0], value_collectives=1, overlap_grad_reduce=True,
                          values_in_grad_sync=True), 0.5, 0.4, _calls(values=0.2))  # fmt: skip
    assert fused["grad"] == pytest.approx(0.2) and fused["hidden_grad"] == 0.0  # after backward


def test_points_join_each_method_with_its_floor_and_model():
    q = Quiet([], 0.2, 1.1, 0.0, 30.0, 31.0, False)
    rnd = Round("w2-1gbit", 2, "1gbit", 1000.0, quiet=q, backward_s=0.05,
                methods={"dense-no-overlap": _m([0.5, 0.5]), "dense-overlap": _m([0.4, 0.4]),
                         "scape-99": _m([0.25, 0.25])},
                floors={"dense-no-overlap": _m([0.1]), "scape-99": _m([0.2])},
                calls={"dense-no-overlap": _calls(grad_values=0.3, param_values=0.2)})  # fmt: skip
    pts = {p.method: p for p in ms.sweep_points({"w2-1gbit": rnd})}
    d, s, o = pts["dense-no-overlap"], pts["scape-99"], pts["dense-overlap"]
    assert d.floor_s == 0.1 and d.comm_over_compute == pytest.approx(4.0)
    assert s.step_over_floor == pytest.approx(1.25) and o.floor_s is None
    assert s.speedup_vs_no_overlap == 2.0 and s.speedup_vs_overlap == 1.6
    assert s.speedup_vs_best_dense == 1.6
    assert d.predicted["total"] == pytest.approx(0.6) and d.model_error == pytest.approx(0.2)
    assert s.predicted is None  # its calls were not timed
    assert (d.load_before, d.load_after, d.noisy) == (0.2, 1.1, False)


def test_records_round_trip_and_refuse_a_key_of_another_format():
    rnd = Round("w2-1gbit", 2, "1gbit", 1000.0, methods={"a": _m([0.1, 0.2])},
                calls={"a": _calls(values=0.1)}, quiet=Quiet([{"attempt": 1}], 1, 2, 0, 3, 4, True))  # fmt: skip
    doc = Sweep(commit="abc", rounds={"w2-1gbit": rnd}, points=ms.sweep_points({"r": rnd}))
    back = from_json(Sweep, json.loads(json.dumps(dataclasses.asdict(doc))))
    assert back == doc and isinstance(back.rounds["w2-1gbit"].calls["a"][0], Call)
    old = dataclasses.asdict(doc)
    old["rounds"]["w2-1gbit"]["fits"] = {}  # an older sweep's alpha-beta fits
    with pytest.raises(ValueError, match=r"Round: unknown keys \['fits'\]"):
        from_json(Sweep, old)
    assert from_json(Sweep, {"skipped": "not root"}) == Sweep(skipped="not root")


def test_without_namespaces_a_skip_record_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "skip_reason", lambda: "not root: test")
    out = tmp_path / "m.json"
    assert ms.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"skipped": "not root: test"}


def test_beside_a_study_it_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "skip_reason", lambda: None)
    monkeypatch.setattr(netns, "remove_stale", lambda: [])
    monkeypatch.setattr(
        quiet, "busy_processes", lambda: [(4242, "python -m pipelines.quality_study")]
    )
    with pytest.raises(SystemExit, match="refusing to time beside pid 4242"):
        ms.main(["--out", str(tmp_path / "m.json")])


def _mode():
    return [] if skip_reason() is None else ["--loopback"]


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_a_round_through_the_pretrain_engines_with_each_methods_floor(tmp_path, prepared_default):
    out = tmp_path / "m.json"
    # one measured step of two methods: 4 launches (steps and floor each), under a minute
    argv = ["--worlds", "2", "--rates-mbit", "1000", "--steps", "1", "--warmup", "1",
            "--methods", "dense-no-overlap", "scape-99", "--model-overrides", *TINY,
            "--timeout", "400", "--out", str(out), *QUIET_OFF, *_mode()]  # fmt: skip
    assert ms.main(argv) == 0
    doc = from_json(Sweep, json.loads(out.read_text()))
    assert doc.complete and list(doc.rounds) == ["w2-1gbit"]
    rnd = doc.rounds["w2-1gbit"]
    assert rnd.error is None, rnd.error
    assert (
        rnd.quiet.load_before >= 0 and len(rnd.quiet.attempts) == 1 and rnd.quiet.host_ms_before > 0
    )
    assert set(rnd.methods) == set(rnd.floors) == {"dense-no-overlap", "scape-99"}
    assert rnd.backward_s > 0 and rnd.forward_s > 0
    m = rnd.methods
    # the pretrain configs, as built: Megatron uses one bucket without the overlap
    assert m["dense-no-overlap"].buckets == 1 and m["scape-99"].buckets > 1
    assert m["scape-99"].overlap_grad_reduce and m["scape-99"].values_in_grad_sync
    assert m["scape-99"].label == "SCAPE-99" and m["dense-no-overlap"].label == "AdamS"
    n = m["dense-no-overlap"].n_params
    # dense ZeRO-1 on CPU: fp32 grads reduce-scattered, fp32 params all-gathered, W=2
    assert m["dense-no-overlap"].bytes_per_rank["grad_values"] >= 4 * n / 2
    dense_total = sum(m["dense-no-overlap"].bytes_per_rank.values())
    assert sum(m["scape-99"].bytes_per_rank.values()) < dense_total / 20
    for e in [*m.values(), *rnd.floors.values()]:
        assert len(e.step_s_all) == 1 and all(t > 0 and math.isfinite(t) for t in e.step_s_all)
    # each method's own collectives, timed bare at its step's sizes (what the model books)
    calls = {name: {c.kind: c for c in cs} for name, cs in rnd.calls.items()}
    assert set(calls["scape-99"]) == {"values", "masks"}
    assert set(calls["dense-no-overlap"]) == {"grad_values", "param_values"}
    ring = 1 / 2  # counted: (W-1)/W of each tensor
    assert calls["dense-no-overlap"]["grad_values"].nbytes == pytest.approx(
        m["dense-no-overlap"].bytes_per_rank["grad_values"] / ring, rel=1e-3)  # fmt: skip
    # an all-reduce's tensor, counted half as gradient and half as parameter values
    tensor = m["scape-99"].bytes_per_rank["grad_values"] / m["scape-99"].buckets / ring
    assert calls["scape-99"]["values"].nbytes == pytest.approx(tensor, rel=1e-2)
    assert all(c.seconds > 0 for cs in calls.values() for c in cs.values())
    pts = {p.method: p for p in doc.points}
    assert set(pts) == set(m) and all(p.floor_s > 0 and p.predicted for p in pts.values())
    assert pts["scape-99"].speedup_vs_no_overlap > 0


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_every_scape_part_is_timed_inside_the_floor_step(tmp_path, prepared_default):
    out = tmp_path / "parts.json"
    argv = ["--parts", "--methods", "scape-99", "--steps", "2", "--warmup", "2",
            "--model-overrides", *TINY, "--out", str(out), *QUIET_OFF]  # fmt: skip
    assert ms.main(argv) == 0
    doc = json.loads(out.read_text())
    assert (
        doc["world_size"] == 2
        and "load_before" in doc["quiet"]
        and list(doc["methods"]) == ["scape-99"]
    )
    scape = doc["methods"]["scape-99"]
    # after the one dense warm-up step every part runs: pack in backward, the rest in the step
    assert all(scape["parts_s"][k] > 0 for k in ms.PARTS)
    assert sum(scape["parts_s"].values()) < scape["step_s"]
    assert scape["forward_s"] > 0 and scape["backward_s"] > 0
