"""Hydra stage: SCAPE against its peers (issue 8), through the pretrain stage itself.

    python -m pipelines.peers_study                    # tiny GPT, 9 methods x 3 seeds (~45 min here)
    python -m pipelines.peers_study quick=true         # 2 methods, 1 seed, a few steps (the test)
    python -m pipelines.peers_study report_only=true   # the table and figure again (e.g. after
                                                       # make bench-peers-cluster)
    make peers-study [QUICK=1]

Every (method, seed) is one ordinary pretrain run of ``conf/experiment/peers_gpt345m_owt``
(same model, data, batch, ranks and schedule; finished runs are skipped, so the study
resumes), then :func:`pipelines.studies.peers_report.report` writes ``<out_dir>/``: README.md
(the table), peers.csv, peers.json and ``loss_vs_bytes.png`` (validation loss against
cumulative bytes sent per rank).
Step times on the emulated cluster come from ``make bench-peers-cluster`` (1 Gbit/s:
``<out_dir>/cluster.json``; 100 Mbit/s, communication-bound at this model size:
``cluster_100mbit.json``); without those files the time columns say "not measured".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pipelines.studies.peers_report import REFERENCE, MethodResult, report
from pipelines.training.config import ConfigError, compose

__all__ = ["PeersStudyConfig", "run"]

QUICK_OVERRIDES = [
    "train.train_steps=6", "train.warmup_steps=2", "train.eval_interval=3",
    "train.checkpoint_interval=6", "model.num_layers=1",
]  # fmt: skip


@dataclass
class PeersStudyConfig:
    experiment: str = "peers_gpt345m_owt"
    scale: str = "tiny"
    methods: list[str] = field(default_factory=list)  # empty: the experiment's sweep
    seeds: list[int] = field(default_factory=lambda: [1234, 1235, 1236])
    overrides: list[str] = field(default_factory=lambda: ["train.eval_interval=20"])
    output_root: str = "runs/peers"
    out_dir: str = "results/peers"
    # Emulated-cluster results (make bench-peers-cluster), one pair of time columns each;
    # relative to out_dir, missing files skipped.
    cluster_jsons: list[str] = field(
        default_factory=lambda: ["cluster.json", "cluster_100mbit.json"]
    )
    quick: bool = False
    progress: bool = True
    report_only: bool = False  # rewrite the table and figure from finished runs, train nothing


def _run_configs(cfg: PeersStudyConfig) -> list[tuple[str, int, Any]]:
    base = [f"experiment={cfg.experiment}", f"scale={cfg.scale}", *cfg.overrides]
    methods = list(cfg.methods) or list(compose(base).sweep)
    seeds = list(cfg.seeds)
    if cfg.quick:
        methods, seeds = [REFERENCE, "dgc99"], seeds[:1]
        base = [f"experiment={cfg.experiment}", f"scale={cfg.scale}", *QUICK_OVERRIDES]
    if REFERENCE not in methods:
        raise ConfigError(f"methods={methods} must include {REFERENCE} (the reference)")
    runs = []
    for method in methods:
        for seed in seeds:
            overrides = [*base, f"optimizer={method}", f"train.seed={seed}"]
            overrides += [f"output_root={cfg.output_root}", f"progress={cfg.progress}"]
            runs.append((method, seed, compose(overrides)))
    return runs


def run(cfg: PeersStudyConfig | DictConfig) -> list[MethodResult]:
    from pipelines.pretrain import run as pretrain

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)
    runs = _run_configs(cfg)
    for i, (method, seed, run_cfg) in enumerate([] if cfg.report_only else runs, 1):
        print(f"[{i}/{len(runs)}] {run_cfg.optimizer.label} seed {seed}", flush=True)
        result = pretrain(run_cfg)
        if result.get("status") not in ("finished", "already finished"):
            raise RuntimeError(f"{method} seed {seed} did not finish: {result}")
    out_dir = Path(cfg.out_dir)
    command = "python -m pipelines.peers_study " + " ".join(sys.argv[1:])
    results = report(runs, out_dir, [out_dir / p for p in cfg.cluster_jsons], command.strip())
    print((out_dir / "peers.md").read_text())
    print(f"written: {out_dir}/peers.md, peers.csv, peers.json, loss_vs_bytes.png")
    return results


def _register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="peers_study_schema", node=PeersStudyConfig)


_register()


@hydra.main(config_path="../conf", config_name="peers_study", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
