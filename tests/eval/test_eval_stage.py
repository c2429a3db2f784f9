"""The evaluate stage end to end on the tiny model, perplexity by hand, the offline error."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from eval_test_helpers import SHAPE

from eval.config import EvaluateConfig
from eval.errors import EvalError
from eval.harness import LOCAL_TASKS
from eval.perplexity import split_perplexity, window_starts
from eval.splits import SplitReader
from pipelines import evaluate
from scape.megatron.train import causal_mask, position_ids

REPO = Path(__file__).resolve().parents[2]


def test_local_tasks_run_end_to_end(export, tmp_path):
    out = tmp_path / "eval" / "results.json"
    cfg = EvaluateConfig(
        export_dir=str(export),
        limit=4,
        batch_size=4,
        val_max_windows=6,
        tasks_examples=30,
        bootstrap_iters=0,
        output=str(out),
        progress=False,
    )
    document = evaluate.run(cfg)
    saved = json.loads(out.read_text())
    assert saved["tasks"] == document["tasks"] and set(saved["tasks"]) == set(LOCAL_TASKS)
    expected = {
        "scape_lastword": {"acc", "perplexity"},
        "scape_nextsent": {"acc", "acc_norm"},
        "scape_testppl": {"word_perplexity", "byte_perplexity", "bits_per_byte"},
    }
    for task, metrics in expected.items():
        assert metrics <= saved["tasks"][task].keys() and saved["tasks"][task]["examples"] == 4
        assert all(math.isfinite(saved["tasks"][task][m]) for m in metrics)
    val = saved["validation"]
    assert val["windows"] == 6 and val["tokens"] == 6 * SHAPE.seq_length
    assert val["ppl"] == pytest.approx(math.exp(val["loss"]))
    assert saved["export"]["step"] == 7 and saved["versions"]["lm_eval"]
    assert saved["local_tasks"]["config"]["examples"] == 30
    assert (out.parent / "tasks" / "scape_nextsent.jsonl").is_file()
    assert "scape_nextsent (n=4)  acc" in evaluate.table(document)


def test_validation_loss_is_the_models_cross_entropy(loaded, prepared):
    model, _, _ = loaded
    result = split_perplexity(model, prepared, seq_length=SHAPE.seq_length, max_windows=1)
    window = torch.from_numpy(
        SplitReader.open(prepared, "validation").tokens[: SHAPE.seq_length + 1].astype("int64")
    )[None]
    s = SHAPE.seq_length
    with torch.no_grad():
        logits = model(window[:, :-1], position_ids(1, s, "cpu"), causal_mask(s, "cpu"))
    # over the padded vocabulary, like the training loss
    hand = F.cross_entropy(logits[0].double(), window[0, 1:])
    assert result.windows == 1 and result.loss == pytest.approx(float(hand), rel=1e-5)


def test_windows_tile_the_stream_and_subsample_evenly():
    assert window_starts(101, 10, None).tolist() == list(range(0, 100, 10))
    assert window_starts(100, 10, None).tolist() == list(range(0, 90, 10))  # needs s + 1 tokens
    assert window_starts(1001, 10, 3).tolist() == [0, 500, 990]


def test_standard_task_offline_fails_before_loading(export, monkeypatch):
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("eval.offline.hub_reachable", lambda timeout=3.0: False)

    def no_loading(*args, **kwargs):
        raise AssertionError("the model must not be loaded before the task check")

    monkeypatch.setattr(evaluate, "load_exported", no_loading)
    cfg = EvaluateConfig(export_dir=str(export), tasks=["scape_lastword", "hellaswag"])
    with pytest.raises(EvalError, match="task hellaswag needs its data from the Hugging Face hub"):
        evaluate.run(cfg)


def test_command_line_reports_offline_task_in_one_line(export):
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    env["HF_ENDPOINT"] = (
        "http://127.0.0.1:9"  # the discard port: refused at once, no network needed
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.evaluate", f"export_dir={export}", "eval_tasks=paper"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: task lambada_openai needs its data")
    assert "HF_DATASETS_OFFLINE=1" in lines[0] and "scape_lastword" in lines[0]


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_lm_eval_command_line_runs_our_model(export):
    """The installed `scape-lm-eval` script: lm-eval's CLI, our model, a local task."""
    script = Path(sys.executable).parent / "scape-lm-eval"
    assert script.is_file(), "scape-lm-eval is not installed: run `make setup`"
    proc = subprocess.run(
        [str(script), "--model", "scape", "--model_args", f"path={export}", "--device", "cpu",
         "--batch_size", "4", "--tasks", "scape_lastword", "--include_path", "eval/tasks",
         "--limit", "4"],
        cwd=REPO, env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "scape_lastword" in proc.stdout and "acc" in proc.stdout


def _compose(overrides: list[str]) -> EvaluateConfig:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="evaluate", overrides=overrides))


def test_task_sets_compose():
    from eval.offline import STANDARD_TASKS

    assert _compose(["run_dir=r"]).tasks == list(LOCAL_TASKS)
    paper = _compose(["run_dir=r", "eval_tasks=paper"])
    assert isinstance(paper, EvaluateConfig) and paper.tasks == [*STANDARD_TASKS, *LOCAL_TASKS]
    assert _compose(["run_dir=r", "tasks=[hellaswag]", "limit=10"]).tasks == ["hellaswag"]
