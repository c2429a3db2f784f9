"""The efficiency table never shows loopback times as a speed-up: bytes from the runs, no
speed columns, and a note saying where speed is measured; the paper's claims are no column."""

import json
from dataclasses import dataclass

from pipelines.efficiency import SPEED_NOTE, efficiency_table


@dataclass
class _Run:
    experiment: str
    label: str
    total: float

    def bytes_per_step(self, skip: int) -> dict[str, float]:
        return {"grad_values": self.total / 2, "param_values": self.total / 2}

    def run_bytes_per_step(self) -> float:
        return 1.4 * self.total  # e.g. a density ramp's denser first steps


RUNS = [_Run("exp", "AdamS", 4e6), _Run("exp", "SCAPE-99", 1e5)]


def test_bytes_without_speed_or_paper_columns():
    header, rows, note = efficiency_table(RUNS, 2)
    assert not any("speed" in h or "(ms)" in h or "saved" in h or "paper" in h for h in header)
    assert rows[0] == ["exp", "AdamS", "4.000", "2.000", "2.000", "0.000", "5.600"]
    assert rows[1] == ["exp", "SCAPE-99", "0.100", "0.050", "0.050", "0.000", "0.140"]
    assert note == SPEED_NOTE and "make bench-step" in note and "loopback" in note


def test_the_tables_stage_writes_no_loopback_time_as_speed(tmp_path):
    from omegaconf import OmegaConf

    from pipelines.tables import TablesConfig, run
    from pipelines.training.config import compose

    root = tmp_path / "runs"
    for name in ("adams", "scape99"):
        cfg = compose([f"optimizer={name}", "experiment=llama1p8b_step", "scale=tiny"])
        run_dir = root / cfg.experiment / name
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        # a denser first step (left out of the median), then the steady one
        recs = [
            {"step": s, "loss": 4.0, "step_time": 9.9, "bytes": {"grad_values": b}}
            for s, b in ((1, 5e5), (5, 1e5))
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run(TablesConfig(output_root=str(root), out_dir=str(tmp_path / "tables")))
    eff = (tmp_path / "tables" / "efficiency.md").read_text()
    assert "9900" not in eff and "9.9" not in eff and "make bench-step" in eff
    csv_header = (tmp_path / "tables" / "efficiency.csv").read_text().splitlines()[0]
    assert "speed" not in csv_header and "0.100" in eff
    assert "| 0.100 | 0.100 | 0.000 | 0.000 | 0.300 |" in eff  # steady median, then run mean
