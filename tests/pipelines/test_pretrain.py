"""The pretrain stage end to end on 2 CPU ranks: a run, a SIGKILL mid-way, and its resumption.

The resumed run must log exactly the losses of an uninterrupted one from the checkpoint on:
model, optimizer state (SCAPE's moments, fp32 params and masks, through Megatron's
distributed checkpointing), LR schedule, RNG and the data position all come back. The same
on the simulator engine (one process, W workers; its state in the rank file).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.training.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]


def _command(optimizer: str, output_root: Path, progress: bool = False,
             engine: str = "megatron") -> list[str]:  # fmt: skip
    return [
        sys.executable, "-m", "pipelines.pretrain", f"optimizer={optimizer}",
        f"train.engine={engine}",
        "train.train_steps=8", "train.checkpoint_interval=4", "train.eval_interval=4",
        "train.warmup_steps=2", "train.consistency_check_interval=2",
        "model.num_layers=2", "wandb.mode=disabled", f"progress={str(progress).lower()}",
        f"output_root={output_root}",
    ]  # fmt: skip


def _run_dir(output_root: Path, label: str) -> Path:
    return output_root / "default" / f"tiny_gpt-{label}-seed1234"


@pytest.mark.parametrize(
    "optimizer, label, engine",
    [("scape99", "SCAPE-99", "megatron"), ("scape99", "SCAPE-99", "simulator")],
)
def test_sigkill_then_resume_gives_the_uninterrupted_losses(
    tmp_path, prepared_default, optimizer, label, engine
):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    # With its output in a file, as in a Slurm job or `make reproduce-table > log`: progress
    # must be plain lines, not a bar's carriage-return frames (every line, at interval 0).
    log = tmp_path / "straight.log"
    with log.open("w") as out:
        subprocess.run(
            _command(optimizer, straight, progress=True, engine=engine),
            cwd=REPO,
            env={**env, "SCAPE_PROGRESS_EVERY_S": "0"},
            check=True,
            stdout=out,
            stderr=out,
        )
    reference = read_metrics(_run_dir(straight, label) / "metrics.jsonl")
    assert [r["step"] for r in reference] == list(range(1, 9))
    text = log.read_text()
    assert text.count("\r") == 0, "progress frames in a redirected log"
    run_name = _run_dir(straight, label).name
    assert f"{run_name}: 8/8 step (100%), loss=" in text, text[-2000:]
    rank0 = (_run_dir(straight, label) / "logs" / "rank0.log").read_text()
    assert f"{run_name}: 8/8 step (100%), loss=" in rank0  # what a Slurm job's log shows

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _command(optimizer, killed, engine=engine),
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = _run_dir(killed, label) / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r["step"] >= 6 for r in read_metrics(metrics)):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks, no chance to clean up
    proc.wait()
    assert not (_run_dir(killed, label) / "summary.json").exists(), (
        "the run finished before the kill"
    )

    subprocess.run(_command(optimizer, killed, engine=engine), cwd=REPO, env=env, check=True,
                   capture_output=True)  # fmt: skip
    resumed = read_metrics(metrics)
    assert [r["step"] for r in resumed] == list(range(1, 9))
    summary = json.loads((_run_dir(killed, label) / "summary.json").read_text())
    assert summary["resumed_from"] == 4
    for a, b in zip(reference, resumed, strict=True):
        assert a["loss"] == b["loss"], f"step {a['step']}"
        assert a.get("val_loss") == b.get("val_loss")
    assert (_run_dir(killed, label) / "export" / "model.pt").is_file()
    ckpts = sorted(p.name for p in (_run_dir(killed, label) / "checkpoints").iterdir())
    assert ckpts == ["step_00000004", "step_00000008"]
    if engine == "megatron":  # SCAPE's state went through Megatron's distributed checkpointing
        sharded = _run_dir(killed, label) / "checkpoints" / "step_00000004" / "optimizer"
        assert (sharded / "metadata.json").is_file() and list(sharded.glob("*.distcp"))
