"""Hydra stage: the verdict's runs (issue 27) as an ordered queue of resumable batches.

    python -m pipelines.quality_queue                      # every batch, 2 workers each
    python -m pipelines.quality_queue 'only=[bf16_1500]'   # some batches
    make quality-queue [ARGS=...]

Each batch is one quality study (``overrides`` on ``conf/quality_study.yaml``) run by
``workers`` processes at once over the same plan: a worker claims a run before running it
(:mod:`pipelines.studies.claims`), so runs split between the workers, and finished runs are
skipped. Killed at any point, the queue restarts where it stopped: finished runs stay, the
runs that were under way start again. Each worker logs to ``<log_dir>/<batch>/worker<i>.log``;
the queue prints their progress lines and, at the end, rewrites the report.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import MISSING, DictConfig, OmegaConf

from pipelines.stage import one_line_errors, register_schema

__all__ = ["Batch", "QualityQueueConfig", "run"]

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Batch:
    name: str = MISSING
    why: str = ""  # one line: what the batch is for
    overrides: list[str] = field(default_factory=list)  # on conf/quality_study.yaml


@dataclass
class QualityQueueConfig:
    batches: list[Batch] = field(default_factory=list)
    only: list[str] = field(default_factory=list)  # run only these batches (empty: all)
    workers: int = 2  # processes per batch, one core each
    data_dir: str = "data/enwiki_sample__bytebpe1k"
    extra: list[str] = field(default_factory=list)  # more overrides for every batch's study
    log_dir: str = "outputs/quality_queue"
    report: bool = True  # rewrite results/quality's report after the last batch


def _selected(cfg: QualityQueueConfig) -> list[Batch]:
    names = [b.name for b in cfg.batches]
    unknown = [n for n in cfg.only if n not in names]
    if unknown:
        raise ValueError(f"only={unknown}: no such batch; the batches are {', '.join(names)}")
    if cfg.workers < 1:
        raise ValueError(f"workers={cfg.workers}: use 1 or more")
    return [b for b in cfg.batches if not cfg.only or b.name in cfg.only]


def _study(cfg: QualityQueueConfig, logs: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.quality_study", f"data_dir={cfg.data_dir}",
            *overrides, *cfg.extra, f"hydra.run.dir={logs / 'hydra'}"]  # fmt: skip


def run_batch(cfg: QualityQueueConfig, batch: Batch, label: str) -> None:
    """The batch's workers, started together; their run lines printed as they come."""
    logs = Path(cfg.log_dir) / batch.name
    logs.mkdir(parents=True, exist_ok=True)
    cmd = _study(cfg, logs, "report=false", *batch.overrides)
    workers, files, seen = [], [], []
    for i in range(cfg.workers):
        out = open(logs / f"worker{i}.log", "a", encoding="utf-8")  # noqa: SIM115
        files.append(out)
        seen.append(out.tell())  # an earlier batch's lines in the log are not this one's
        workers.append(subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT))
        time.sleep(5)  # staggered: the first claims the first run before the second looks
    try:
        while True:
            done = [w.poll() is not None for w in workers]
            for i in range(cfg.workers):
                with open(logs / f"worker{i}.log", "rb") as f:
                    f.seek(seen[i])
                    new = f.read()
                new = new[: new.rfind(b"\n") + 1]  # whole lines only: the rest comes next time
                seen[i] += len(new)
                for line in new.decode("utf-8", errors="replace").splitlines():
                    if line.startswith(("[", "waiting", "error")) or "no closed lr grid" in line:
                        print(f"{label} w{i} {line}", flush=True)
            if all(done):
                break
            time.sleep(5)
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
        for f in files:
            f.close()
    failed = [i for i, w in enumerate(workers) if w.returncode != 0]
    if failed:
        raise RuntimeError(
            f"batch {batch.name}: worker {failed[0]} exited with {workers[failed[0]].returncode}"
            f"; see {logs / f'worker{failed[0]}.log'}"
        )


def run(cfg: QualityQueueConfig | DictConfig) -> None:
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    assert isinstance(cfg, QualityQueueConfig)
    batches = _selected(cfg)
    for i, batch in enumerate(batches, 1):
        label = f"[batch {i}/{len(batches)} {batch.name}]"
        print(f"{label} {batch.why}", flush=True)
        run_batch(cfg, batch, label)
    if cfg.report:
        report = _study(cfg, Path(cfg.log_dir) / "report", "report_only=true")
        subprocess.run(report, cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        print("report rewritten: results/quality/summary.md, README.md", flush=True)


register_schema("quality_queue", QualityQueueConfig)


@hydra.main(config_path="../conf", config_name="quality_queue", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(ValueError, RuntimeError):
        run(cfg)


if __name__ == "__main__":
    main()
