"""The efficiency table never shows loopback times as a speed-up: speed columns only from an
emulated-cluster step-time file, else left out with the reason (synthetic files)."""

import json
from dataclasses import dataclass

from pipelines.efficiency import efficiency_table, read_step_times

CLAIMS = {("exp", "SCAPE-99"): "up to 3.26x per step vs AdamS"}


@dataclass
class _Run:
    experiment: str
    label: str
    total: float

    def bytes_per_step(self, skip: int) -> dict[str, float]:
        return {"grad_values": self.total / 2, "param_values": self.total / 2}


RUNS = [_Run("exp", "AdamS", 4e6), _Run("exp", "SCAPE-99", 1e5)]


def _point(label, step, speedup, **extra):
    return {"experiment": "exp", "optimizer": label, "step_s": step, "step_s_p25": step * 0.9,
            "step_s_p75": step * 1.2, "speedup_vs_reference": speedup, "reference": "AdamS",
            "load_before": 0.4, "load_after": 1.3, "noisy": False, **extra}  # fmt: skip


def test_no_file_no_speed_columns(tmp_path):
    header, rows, note = efficiency_table(RUNS, 2, tmp_path / "steptime.json", CLAIMS)
    assert not any("speed" in h or "(ms)" in h or "saved" in h for h in header)
    assert rows[1] == ["exp", "SCAPE-99", "0.100", "0.050", "0.050", "0.000",
                       "up to 3.26x per step vs AdamS"]  # fmt: skip
    assert note.startswith("No speed columns") and "not found" in note and "loopback" in note


def test_a_skipped_benchmark_says_why(tmp_path):
    path = tmp_path / "steptime.json"
    path.write_text(json.dumps({"skipped": "not root: the emulated cluster needs namespaces"}))
    header, _, note = efficiency_table(RUNS, 2, path, CLAIMS)
    assert "speed-up vs AdamS" not in header
    assert "skipped (not root: the emulated cluster needs namespaces)" in note


def test_an_unreadable_or_empty_file_leaves_the_columns_out(tmp_path):
    path = tmp_path / "steptime.json"
    path.write_text("{not json")
    assert read_step_times(path)[0] == {} and "unreadable" in read_step_times(path)[1]
    path.write_text(json.dumps({"points": []}))
    assert read_step_times(path)[0] == {} and "holds no step times" in read_step_times(path)[1]


def test_step_times_from_the_emulated_cluster(tmp_path):
    path = tmp_path / "steptime.json"
    doc = {"suite": "reproduce", "world_size": 2, "link": {"label": "1gbit"}, "steps": 8,
           "points": [_point("AdamS", 0.300, 1.0),
                      _point("SCAPE-99", 0.120, 2.5, noisy=True, load_before=2.1)]}  # fmt: skip
    path.write_text(json.dumps(doc))
    header, rows, note = efficiency_table(RUNS, 2, path, CLAIMS)
    i = header.index("speed-up vs AdamS")
    assert header[i - 1] == "emulated step (ms)" and header[-1] == "paper"
    assert rows[0][i - 1 : i + 3] == ["300 [270-360]", "1.00x", "0.0%", "0.40/1.30"]
    # time saved per step = 1 - 1/speed-up
    assert rows[1][i - 1 : i + 3] == ["120 [108-144]", "2.50x", "60.0%", "2.10/1.30 noisy"]
    assert "2 ranks" in note and "1gbit" in note and "median over 8 steps" in note
    assert "load average 0.40-2.10" in note and "noisy): exp SCAPE-99" in note


def test_a_run_without_a_point_gets_dashes(tmp_path):
    path = tmp_path / "steptime.json"
    path.write_text(json.dumps({"points": [_point("AdamS", 0.3, 1.0)]}))
    header, rows, _ = efficiency_table(RUNS, 2, path, CLAIMS)
    i = header.index("speed-up vs AdamS")
    assert rows[1][i - 1 : i + 3] == ["-", "-", "-", "-"]


def test_the_tables_stage_reads_the_file_under_the_output_root(tmp_path):
    from omegaconf import OmegaConf

    from pipelines.tables import TablesConfig, run
    from pipelines.training.config import compose

    root = tmp_path / "runs"
    for name in ("adams", "scape99"):
        cfg = compose([f"optimizer={name}", "experiment=llama1p8b_step", "scale=tiny"])
        run_dir = root / cfg.experiment / name
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        rec = {"step": 5, "loss": 4.0, "step_time": 9.9, "bytes": {"grad_values": 1e5}}
        (run_dir / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    point = _point("SCAPE-99", 0.1, 3.0, experiment="llama1p8b_step")
    (root / "steptime.json").write_text(json.dumps({"points": [point]}))
    run(TablesConfig(output_root=str(root), out_dir=str(tmp_path / "tables")))
    eff = (tmp_path / "tables" / "efficiency.md").read_text()
    assert "| 3.00x | 66.7% |" in eff and "9900" not in eff and "9.9" not in eff
    csv_header = (tmp_path / "tables" / "efficiency.csv").read_text().splitlines()[0]
    assert "speed-up vs AdamS" in csv_header
