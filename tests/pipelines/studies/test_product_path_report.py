"""The product-path check's arithmetic: gaps paired by seed within each path, the product
path's change of the gap, and a table that recomputes from the packed runs alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.studies.product_path import gaps, pack, read_archive, report

# (path, variant, seed) -> final loss; AdamS 4.0 / 5.0 by seed on the study path
LOSSES = {
    ("study", "adams", 0): 4.0, ("study", "adams", 1): 5.0,
    ("study", "scape99_ramp", 0): 4.4, ("study", "scape99_ramp", 1): 5.0,
    ("product", "adams", 0): 4.0, ("product", "adams", 1): 4.0,
    ("product", "scape99_ramp", 0): 4.2, ("product", "scape99_ramp", 1): 4.4,
}  # fmt: skip


def _write_runs(root: Path) -> None:
    for (path, variant, seed), loss in LOSSES.items():
        header = {"event": "header", "model": "llama", "variant": variant, "seed": seed,
                  "steps": 300, "code": {"commit": "abc", "step_code": "v1"},
                  "settings": {"scale": {"path": path} if path != "study" else {}}}  # fmt: skip
        final = {"event": "final", "final_val_loss": loss}
        log = root / path / f"llama__{variant}__s{seed}__t300.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(json.dumps(header) + "\n" + json.dumps(final) + "\n")


def test_gaps_pair_each_seed_with_its_own_paths_adams_run(tmp_path):
    _write_runs(tmp_path / "runs")
    pack(tmp_path / "runs", tmp_path / "out" / "runs.tar.xz")
    runs = read_archive(tmp_path / "out" / "runs.tar.xz")
    assert sorted(r["path"] for r in runs) == ["product"] * 4 + ["study"] * 4  # old headers: study
    cell = gaps(runs)["llama"]["scape99_ramp"]
    assert cell["seeds"] == [0, 1]
    assert cell["study"]["gap_pct"]["mean"] == pytest.approx((10.0 + 0.0) / 2)
    assert cell["product"]["gap_pct"]["mean"] == pytest.approx((5.0 + 10.0) / 2)
    # paired by seed: (5 - 10) and (10 - 0)
    assert cell["gap_moved_pct"]["mean"] == pytest.approx(2.5)
    assert cell["gap_moved_pct"]["sd"] == pytest.approx(abs(-5.0 - 10.0) / 2**0.5)
    assert cell["loss_moved_pct"]["mean"] == pytest.approx(100 * (4.2 / 4.4 + 4.4 / 5.0 - 2) / 2)


def test_the_table_recomputes_from_the_archive_alone(tmp_path):
    _write_runs(tmp_path / "runs")
    out = tmp_path / "out"
    pack(tmp_path / "runs", out / "runs.tar.xz")
    first = report(out / "runs.tar.xz", out)
    readme = (out / "README.md").read_text()
    (out / "README.md").unlink()
    assert report(out / "runs.tar.xz", out) == first
    assert (out / "README.md").read_text() == readme
    assert (
        "| llama | scape99_ramp | 2 | 4.700 ± 0.424 | 4.300 ± 0.141 | -8.27 ± 5.27 | +5.00 ± 7.07 "
        in readme
    )
