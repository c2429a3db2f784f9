"""The peers study's report: seed statistics, the bytes curve, and time to target."""

import pytest

from pipelines.studies.peers_report import _attach_times, _table, summarize_method


def _records(losses: dict[int, float], bytes_per_step: float, steps: int) -> list[dict]:
    out = []
    for step in range(1, steps + 1):
        r = {
            "step": step,
            "loss": 9.0,
            "bytes": {"grad_values": bytes_per_step / 2, "masks": bytes_per_step / 2},
        }
        if step in losses:
            r["val_loss"] = losses[step]
        out.append(r)
    return out


def test_seed_mean_spread_and_bytes_curve():
    runs = [_records({2: 5.0, 4: 4.0}, 100.0, 4), _records({2: 6.0, 4: 5.0}, 100.0, 4)]
    r = summarize_method("dgc99", "DGC-99", runs)
    assert r.seeds == 2 and r.final_val_loss == pytest.approx(4.5)
    assert r.final_val_loss_std == pytest.approx(0.7071, abs=1e-4)
    assert r.bytes_per_step == pytest.approx(100.0)
    assert r.eval_steps == [2, 4] and r.curve == [(200.0, 5.5), (400.0, 4.5)]


def test_a_diverged_seed_is_counted_and_left_out_of_the_mean():
    nan = float("nan")
    runs = [_records({2: 5.0, 4: 4.0}, 10.0, 4), _records({2: 9.0, 4: nan}, 10.0, 4)]
    r = summarize_method("onebit", "1-bit-Adam", runs)
    assert (r.seeds, r.diverged, r.final_val_loss, r.curve) == (
        2,
        1,
        4.0,
        [(20.0, 5.0), (40.0, 4.0)],
    )
    all_nan = summarize_method("onebit", "1-bit-Adam", [_records({4: nan}, 10.0, 4)])
    assert (
        all_nan.diverged == 1
        and all_nan.curve == []
        and all_nan.final_val_loss != all_nan.final_val_loss
    )


def test_time_to_target_uses_the_cluster_step_time_or_says_never():
    ref = summarize_method("adams", "AdamS", [_records({2: 5.0, 4: 4.0}, 1000.0, 4)])
    fast = summarize_method("scape99", "SCAPE-99", [_records({2: 3.9, 4: 3.5}, 10.0, 4)])
    slow = summarize_method("dgc99", "DGC-99", [_records({2: 6.0, 4: 4.5}, 10.0, 4)])
    cluster = {
        "link": {"label": "1gbit"},
        "methods": {"adams": {"step_time_s": 0.5}, "scape99": {"step_time_s": 0.1}},
    }
    _attach_times([ref, fast, slow], [cluster])
    assert (ref.steps_to_target, ref.time_to_target_s) == (4, {"1gbit": 2.0})
    assert fast.steps_to_target == 2 and fast.time_to_target_s["1gbit"] == pytest.approx(0.2)
    assert slow.steps_to_target is None and slow.time_to_target_s == {}
    assert "never" in _table([ref, fast, slow], ["1gbit"]).splitlines()[-1]
