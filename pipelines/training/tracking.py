"""Run metrics: an append-only JSONL file (the source of truth) mirrored to Weights & Biases.

W&B runs offline by default (files under the run directory, ``wandb sync`` uploads them
later) and online when ``WANDB_API_KEY`` is set; ``wandb.mode=disabled`` turns it off.
Each JSONL line is flushed as it is written, so a crash loses nothing already logged; on
resume, lines past the checkpoint's step are dropped so the file tells one consistent story.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipelines.training.config import PretrainConfig, sparsity_of
from pipelines.training.metrics import sent_by_kind

__all__ = ["METRICS_FILE", "RunLogger", "read_metrics", "run_name", "wandb_mode", "wandb_tags"]

METRICS_FILE = "metrics.jsonl"


def run_name(cfg: PretrainConfig) -> str:
    if cfg.run_name:
        return cfg.run_name
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.optimizer.label).strip("-")
    return f"{cfg.model.name}-{label}-seed{cfg.train.seed}"


def wandb_tags(cfg: PretrainConfig) -> list[str]:
    """The run's W&B tags: optimizer, sparsity, model and seed (W&B's UI filters on them; the
    experiment is the run's group), then the configured extra tags."""
    return [
        f"optimizer={cfg.optimizer.label}",
        f"sparsity={sparsity_of(cfg.optimizer):g}",
        f"model={cfg.model.name}",
        f"seed={cfg.train.seed}",
        *cfg.wandb.tags,
    ]


def wandb_mode(configured: str) -> str:
    if configured != "auto":
        return configured
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete lines (a line cut by a crash is skipped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class RunLogger:
    def __init__(self, run_dir: Path, cfg: PretrainConfig, *, enabled: bool) -> None:
        self.run_dir, self.cfg, self.enabled = run_dir, cfg, enabled
        self.path = run_dir / METRICS_FILE
        self._file = None
        self._wandb = None

    def warn(self, message: str) -> None:
        print(f"warning: {message}", file=sys.stderr, flush=True)
        if self.enabled:
            with open(self.run_dir / "events.log", "a") as f:
                f.write(message + "\n")

    def start(self, *, resumed_from: int) -> None:
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resumed_from]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - open for the run's life
        mode = wandb_mode(self.cfg.wandb.mode)
        if mode != "disabled":
            self._start_wandb(mode)

    def _start_wandb(self, mode: str) -> None:
        import wandb

        cfg = self.cfg
        # A stable id per run directory, so a resumed run continues the same W&B run.
        run_id = hashlib.sha1(str(self.run_dir.resolve()).encode()).hexdigest()[:16]
        self._wandb = wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            group=cfg.experiment,  # what the W&B reports' runsets filter on
            name=self.run_dir.name,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=str(self.run_dir),
            tags=wandb_tags(cfg),
            config=asdict(cfg),
        )

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            flat = {k: v for k, v in record.items()
                    if k not in ("bytes", "bytes_by_kind") and v is not None}  # fmt: skip
            flat.update({f"bytes/{k}": v for k, v in sent_by_kind(record).items()})
            self._wandb.log(flat, step=record["step"])

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
