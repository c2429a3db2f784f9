"""The break-even map: its cells are the projection's, its contour and ratio finders are
consistent, and it renders."""

import json
import math

import pytest

from benchmarks import break_even as be
from benchmarks.projection import Assumptions, calibrated, project_model


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
    key = "scape-99/no_overlap"
    r = be.needed_ratio(curve, key)
    assert r is not None
    assert max(c[key] for c in curve if c["comm_over_compute"] < r) < be.TARGET
    assert min(c[key] for c in curve if c["comm_over_compute"] > r) >= be.TARGET


def test_renders_the_map_its_table_and_every_cell(tmp_path):
    assert be.main(["--bench-dir", str(tmp_path)]) == 0
    assert (tmp_path / "break_even.png").stat().st_size > 10_000
    md = (tmp_path / "break_even.md").read_text()
    assert "needs the dense exchange to take" in md and "| 16,384 | <= " in md
    rows = (tmp_path / "break_even.csv").read_text().splitlines()
    assert len(rows) == 1 + len(be.BANDWIDTHS) * len(be.TOKENS)
    summary = json.loads((tmp_path / "break_even.json").read_text())
    assert summary["needed_comm_over_compute"]["scape-99/no_overlap"] == pytest.approx(
        be.needed_ratio(be.ratio_curve(*calibrated()), "scape-99/no_overlap"))  # fmt: skip
