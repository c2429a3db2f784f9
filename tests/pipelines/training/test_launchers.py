"""Sweeps through Hydra's submitit launcher: the local launcher for real (jobs capped by
run slots), the Slurm launcher's sbatch parameters, and the in-job path each Slurm task
takes (two processes with a Slurm environment, training as ranks 0 and 1)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipelines.training.slots import run_slot

REPO = Path(__file__).resolve().parents[3]
TINY = [
    "train.train_steps=3", "train.warmup_steps=1", "train.eval_interval=3",
    "train.checkpoint_interval=3", "model.num_layers=1", "wandb.mode=disabled", "progress=false",
]  # fmt: skip


def test_run_slot_makes_the_second_run_wait(tmp_path):
    entered = threading.Event()

    def second() -> None:
        with run_slot(tmp_path, 1, poll_s=0.02):
            entered.set()

    with run_slot(tmp_path, 1):
        waiter = threading.Thread(target=second)
        waiter.start()
        assert not entered.wait(0.3), "a second run took the only slot"
    assert entered.wait(5), "the slot was not handed on after release"
    waiter.join()


def test_run_slot_allows_as_many_runs_as_slots(tmp_path):
    with run_slot(tmp_path, 2) as a, run_slot(tmp_path, 2, poll_s=0.01) as b:
        assert {a, b} == {0, 1}
    with pytest.raises(ValueError, match="max_concurrent"), run_slot(tmp_path, 0):
        pass


def test_preemption_checkpoints_then_hands_the_signal_to_submitit():
    from pipelines.training.trainer import _Preemption

    calls = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        preemption = _Preemption()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert preemption.requested and calls == []  # ours first: checkpoint, then requeue
        preemption.hand_back()
        assert calls == [signal.SIGUSR2]
        os.kill(os.getpid(), signal.SIGUSR2)  # the earlier handler is back in place
        assert calls == [signal.SIGUSR2, signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, before)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_vista_launcher_gives_submitit_the_cluster_resources(tmp_path, monkeypatch):
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf

    from pipelines.training.config import CONF_DIR, register_configs

    monkeypatch.setenv("SLURM_ACCOUNT", "TEST-ALLOC")
    register_configs()
    setup_globals()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "pretrain",
            overrides=["hydra/launcher=vista", "cluster=vista", "experiment=gpt345m_owt_quality"],
            return_hydra_config=True,
        )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    expected = {
        "partition": "gh", "account": "TEST-ALLOC", "nodes": 32, "tasks_per_node": 1,
        "gpus_per_node": 1, "array_parallelism": 4, "timeout_min": cfg.cluster.time_minutes,
    }  # fmt: skip
    assert {k: launcher[k] for k in expected} == expected
    assert launcher["setup"] == cfg.cluster.setup and launcher["setup"]
    # What the plugin does with these (launch()): submitit must accept every key.
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # no srun here
    executor = submitit.AutoExecutor(folder=str(tmp_path), cluster="slurm")
    base = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb",
            "nodes", "name", "stderr_to_stdout"}  # fmt: skip
    params = {
        (k if k in base else f"slurm_{k}"): v
        for k, v in launcher.items()
        if k not in ("_target_", "submitit_folder", "max_num_timeout")
    }
    executor.update_parameters(**params)
    script = executor._executor._make_submission_file_text("python -m x", "uid")
    for line in ("#SBATCH --partition=gh", "#SBATCH --account=TEST-ALLOC", "#SBATCH --nodes=32",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --signal=USR2@120"):  # fmt: skip
        assert line in script
    assert "source $WORK/miniforge3/bin/activate scape" in script
    assert "export HF_HOME=$WORK/scape-hf-cache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" in script


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_slurm_task_trains_its_rank_in_place(tmp_path, prepared_default):
    """What Hydra's submitit launcher runs in every task: pipelines.pretrain.run(cfg)."""
    overrides = [*TINY, "optimizer=adams", f"output_root={tmp_path}"]
    code = (
        "from pipelines.training.config import compose; from pipelines.pretrain import run; "
        f"print(run(compose({overrides!r})))"
    )
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ, "OMP_NUM_THREADS": "1", "SUBMITIT_EXECUTOR": "slurm",
            "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost", "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank), "MASTER_PORT": port,
        }  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    summary = json.loads(
        (tmp_path / "default" / "tiny_gpt-AdamS-seed1234" / "summary.json").read_text()
    )
    assert summary["status"] == "finished" and summary["step"] == 3


def test_slurm_task_count_must_match_the_cluster_config(tmp_path, monkeypatch):
    from pipelines.training.config import ConfigError, compose
    from pipelines.training.slurm import train_in_slurm_task

    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "1", "SLURM_NTASKS": "3",
                       "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "localhost"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match="3 task"):
        train_in_slurm_task(compose([f"output_root={tmp_path}"]), tmp_path / "run")


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_local_submitit_sweep_runs_jobs_one_at_a_time(tmp_path, prepared_default):
    out = tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.pretrain", "-m", "hydra/launcher=local",
         "optimizer=adams,scape99", *TINY, f"output_root={out}",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    spans = []
    for label in ("AdamS", "SCAPE-99"):
        summary = json.loads(
            (out / "default" / f"tiny_gpt-{label}-seed1234" / "summary.json").read_text()
        )
        assert summary["status"] == "finished"
        spans.append((summary["session_started_at"], summary["finished_at"]))
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, f"cluster.max_concurrent=1 but the runs overlapped: {spans}"
    assert (tmp_path / "sweep" / ".submitit").is_dir()
