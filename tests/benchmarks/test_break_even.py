"""The break-even map: its cells are the projection's, its contour finder and ratio placement
are consistent, and it renders with and without emulated measurements."""

import json
import math

import pytest

from benchmarks import break_even as be
from benchmarks.projection import Assumptions, project_model


def test_a_cell_is_the_projection_at_that_bandwidth_and_batch():
    a = Assumptions()
    cell = be._cell(a, None, 25.0, 4096)
    p = project_model("llama-1.8b", Assumptions(link_gbit=25.0), 4096)
    assert cell["scape-99/no_overlap"] == p["scape"]["scape-99"]["speedup_no_overlap"]
    assert cell["scape-90/full_overlap"] == p["scape"]["scape-90"]["speedup_full_overlap"]
    dense = p["dense_comm_s"]["grad_sync"] + p["dense_comm_s"]["param_sync"]
    assert cell["comm_over_compute"] == pytest.approx(
        dense / (p["dense_step_s"]["no_overlap"] - dense)
    )


def test_speed_up_falls_with_bandwidth_and_batch():
    cells = be.grid(Assumptions(), None, [1.0, 10.0, 100.0, 400.0], [1024, 16384])
    for t in (1024, 16384):
        row = [c["scape-99/no_overlap"] for c in cells if c["tokens_per_gpu"] == t]
        assert row == sorted(row, reverse=True) and row[0] > row[-1]
    at = {(c["link_gbit"], c["tokens_per_gpu"]): c for c in cells}
    assert at[(100.0, 1024)]["scape-99/no_overlap"] > at[(100.0, 16384)]["scape-99/no_overlap"]


def _power_law_cells(scale):
    return [{"link_gbit": bw, "tokens_per_gpu": 1024, "k": scale / bw} for bw in (1, 10, 100, 400)]


def test_break_even_bandwidth_interpolates_and_says_when_never_or_always():
    # speed-up = 1000 / bw reaches 3.26 at bw = 1000 / 3.26 exactly (log-linear between points)
    assert be.break_even_bandwidth(_power_law_cells(1000), "k", 1024) == pytest.approx(1000 / 3.26)
    assert be.break_even_bandwidth(_power_law_cells(2), "k", 1024) is None  # 2 at 1 Gbit/s
    assert math.isinf(be.break_even_bandwidth(_power_law_cells(1e4), "k", 1024))


def test_needed_ratio_is_where_the_curve_crosses_the_target():
    curve = be.ratio_curve(Assumptions())
    r = be.needed_ratio(curve, "scape-99/no_overlap")
    assert r is not None
    assert be._interp(curve, "scape-99/no_overlap", r) == pytest.approx(be.TARGET, rel=1e-6)
    assert be._interp(curve, "scape-99/no_overlap", r * 0.8) < be.TARGET


def _bench_dir(tmp_path, write_sweep, make_point, with_points):
    if with_points:  # comm / compute = (step - floor) / floor: 4.0 for the dense step
        write_sweep(tmp_path, [make_point("dense-no-overlap", 0.5, 0.1, 1.0),
                               make_point("scape-99", 0.11, 0.1, 3.5),
                               make_point("scape-90", 0.3, 0.1, 1.9)], rounds={})  # fmt: skip
    return tmp_path


def test_renders_without_measurements(tmp_path, write_sweep, make_point):
    d = _bench_dir(tmp_path, write_sweep, make_point, with_points=False)
    assert be.main(["--bench-dir", str(d)]) == 0
    assert (d / "break_even.png").stat().st_size > 10_000
    md = (d / "break_even.md").read_text()
    assert "No emulated measurement yet" in md and "needs the dense exchange to take" in md
    rows = (d / "break_even.csv").read_text().splitlines()
    assert len(rows) == 1 + len(be.BANDWIDTHS) * len(be.TOKENS)


def test_places_each_measurement_at_its_dense_ratio(tmp_path, write_sweep, make_point):
    d = _bench_dir(tmp_path, write_sweep, make_point, with_points=True)
    assert be.main(["--bench-dir", str(d)]) == 0
    summary = json.loads((d / "break_even.json").read_text())
    (m,) = summary["measured"]
    assert m["comm_over_compute"] == pytest.approx(4.0)  # the dense step's ratio, not SCAPE's
    assert m["scape-99/no_overlap"] == 3.5 and m["scape-99/full_overlap"] == pytest.approx(2.8)
    curve = be.ratio_curve(Assumptions())
    assert m["scape-99/no_overlap/projected"] == pytest.approx(
        be._interp(curve, "scape-99/no_overlap", 4.0)
    )
    assert (m["load_before"], m["load_after"], m["noisy"]) == (0.3, 1.2, False)
    assert "No emulated measurement yet" not in (d / "break_even.md").read_text()
