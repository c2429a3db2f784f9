"""The peers study: seed statistics, time to target, and a quick real run through pretrain."""

import json
from pathlib import Path

import pytest

from pipelines.peers_study import PeersStudyConfig, run
from pipelines.studies.peers_report import _attach_times, _table, summarize_method

REPO = Path(__file__).resolve().parents[2]


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


def test_quick_study_runs_both_methods_through_pretrain(tmp_path, prepared_default, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = PeersStudyConfig(
        quick=True,
        output_root=str(tmp_path / "runs"),
        out_dir=str(tmp_path / "out"),
        progress=False,
    )
    results = {r.method: r for r in run(cfg)}
    assert set(results) == {"adams", "dgc99"}
    # Dense ZeRO-1 fp32 sends 4n bytes per rank at W=2; DGC-99 8 bytes (index + value) per
    # selected entry, 1% of n: a ratio of 50.
    ratio = results["adams"].bytes_per_step / results["dgc99"].bytes_per_step
    assert 45 < ratio < 55
    saved = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert [r["method"] for r in saved["results"]] == ["adams", "dgc99"]
    assert (tmp_path / "out" / "loss_vs_bytes.png").stat().st_size > 1000
    assert "DGC-99" in (tmp_path / "out" / "peers.md").read_text()
