"""The W&B report of a finished tiny experiment, built with wandb-workspaces and no network."""

import json

import pytest
from omegaconf import OmegaConf

from pipelines.tables import TablesConfig, report_lines, run
from pipelines.training.config import compose
from pipelines.wandb_report import load_report, publish

EXPERIMENT = "gpt345m_owt_quality"
LABELS = {"adamw": "AdamW", "adams": "AdamS", "scape90": "SCAPE-90", "scape99": "SCAPE-99"}


def _finished_run(root, optimizer, *, peer_bytes=False):
    """A finished run as the pretrain stage leaves it: config.yaml and metrics.jsonl."""
    cfg = compose([f"experiment={EXPERIMENT}", "scale=tiny", f"optimizer={optimizer}",
                   "wandb.project=scape-test", "wandb.entity=team"])  # fmt: skip
    run_dir = root / EXPERIMENT / f"tiny_gpt-{LABELS[optimizer]}-seed1234"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    kinds = ("grad_values", "param_values") + (("masks",) if optimizer.startswith("scape") else ())
    if peer_bytes:
        kinds += ("powersgd_p",)
    lines = []
    for step in range(1, 6):
        rec = {"step": step, "tokens": 1024 * step, "loss": 7.0 - 0.1 * step, "step_time": 0.2,
               "bytes": dict.fromkeys(kinds, 1000.0)}  # fmt: skip
        if step == 5:
            rec["val_loss"] = 6.6
        lines.append(json.dumps(rec))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def no_wandb_server(monkeypatch):
    """Any attempt to reach W&B fails the test: no API object, no GraphQL call."""
    import wandb
    from wandb_workspaces.reports.v2 import interface

    def refuse(*args, **kwargs):
        raise AssertionError("the test tried to reach the W&B server")

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setattr(wandb, "Api", refuse)
    monkeypatch.setattr(interface, "execute_graphql", refuse)


def _panels(model: dict) -> list[dict]:
    (grid,) = [b for b in model["spec"]["blocks"] if b["type"] == "panel-grid"]
    return grid["metadata"]["panelBankSectionConfig"]["panels"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny experiment (AdamW, AdamS, SCAPE-90, SCAPE-99) under <tmp>/runs."""
    root = tmp_path_factory.mktemp("experiment")
    for optimizer in LABELS:
        _finished_run(root / "runs", optimizer)
    return root / "runs"


def _tables(runs, out):
    return run(TablesConfig(output_root=str(runs), out_dir=str(out), wandb_report=True))


def test_offline_report_has_the_panels_metrics_and_group_filter(
    finished, tmp_path, no_wandb_server
):
    out = _tables(finished, tmp_path / "t")
    (entry,) = out["wandb_reports"]
    assert entry["experiment"] == EXPERIMENT and entry["url"] is None
    path = tmp_path / "t" / f"wandb_report_{EXPERIMENT}.json"
    model = json.loads(path.read_text())
    assert model["project"] == {"name": "scape-test", "entityName": "team"}
    assert model["displayName"] == f"SCAPE reproduction: {EXPERIMENT}"

    plotted = {(p["config"]["xAxis"], tuple(p["config"]["metrics"])) for p in _panels(model)}
    assert plotted == {
        ("_step", ("loss",)),  # "Step" is W&B's own step axis
        ("_step", ("val_loss",)),
        ("tokens", ("loss",)),
        ("tokens", ("val_loss",)),
        ("_step", ("bytes/grad_values", "bytes/param_values", "bytes/masks")),
        ("_step", ("step_time",)),
    }
    assert all(p["viewType"] == "Run History Line Plot" for p in _panels(model))
    (grid,) = [b for b in model["spec"]["blocks"] if b["type"] == "panel-grid"]
    (runset,) = grid["metadata"]["runSets"]
    assert runset["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": EXPERIMENT,
         "disabled": False}
    ]  # fmt: skip
    text = json.dumps(model)  # the runs the stage logged are named in the report
    assert all(f"tiny_gpt-{label}-seed1234" in text for label in LABELS.values())

    # the library reads its own JSON back unchanged; the stage says how to publish it later
    again = load_report(path)
    assert json.loads(again._to_model().model_dump_json(by_alias=True, exclude_none=True)) == model
    assert any(f"python -m pipelines.wandb_report publish {path}" in line
               for line in report_lines(out["wandb_reports"]))  # fmt: skip

    _tables(finished, tmp_path / "again")  # stable panel and runset ids: a rebuild changes no line
    assert (tmp_path / "again" / path.name).read_text() == path.read_text()


def test_bytes_panel_follows_the_kinds_the_runs_logged(tmp_path, no_wandb_server):
    _finished_run(tmp_path / "runs", "adams", peer_bytes=True)
    _tables(tmp_path / "runs", tmp_path / "t")
    model = json.loads((tmp_path / "t" / f"wandb_report_{EXPERIMENT}.json").read_text())
    metrics = [p["config"]["metrics"] for p in _panels(model)]
    assert ["bytes/grad_values", "bytes/param_values", "bytes/powersgd_p"] in metrics


def test_publish_fills_in_the_runsets_project_then_saves(
    finished, tmp_path, no_wandb_server, monkeypatch
):
    import wandb_workspaces.reports.v2 as wr

    _tables(finished, tmp_path / "t")
    saved = []

    def save(self, draft=False, clone=False):  # Report.save is the one call that goes out
        saved.append(self)
        self.id = "abc"
        return self

    monkeypatch.setattr(wr.Report, "save", save)
    monkeypatch.setattr(wr.Report, "url", property(lambda self: f"https://w/{self.id}"))
    url = publish(tmp_path / "t" / f"wandb_report_{EXPERIMENT}.json", entity="other")
    assert url == "https://w/abc"
    (report,) = saved
    assert (report.entity, report.project) == ("other", "scape-test")
    (grid,) = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    assert [(r.entity, r.project) for r in grid.runsets] == [("other", "scape-test")]


def test_with_a_key_the_stage_saves_and_a_failed_save_keeps_the_json(
    finished, tmp_path, no_wandb_server, monkeypatch
):
    import wandb_workspaces.reports.v2 as wr

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    outcomes = iter(["saved", ConnectionError("W&B unreachable\nmore")])

    def save(self, draft=False, clone=False):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        self.id = "abc"
        return self

    monkeypatch.setattr(wr.Report, "save", save)
    monkeypatch.setattr(wr.Report, "url", property(lambda self: f"https://w/{self.id}"))
    (ok,) = _tables(finished, tmp_path / "a")["wandb_reports"]
    assert ok["url"] == "https://w/abc"
    (failed,) = _tables(finished, tmp_path / "b")["wandb_reports"]
    assert failed["url"] is None and failed["error"] == "ConnectionError: W&B unreachable"
    lines = report_lines([failed])
    assert "not saved (ConnectionError: W&B unreachable)" in lines[0]
    assert (tmp_path / "b" / f"wandb_report_{EXPERIMENT}.json").is_file()
    assert f"publish {failed['json']}" in lines[-1]
