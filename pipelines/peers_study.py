"""Hydra stage: SCAPE against its peers (issue 8), through the pretrain stage itself.

    python -m pipelines.peers_study                    # tiny GPT, 9 methods x 3 seeds (~45 min here)
    python -m pipelines.peers_study quick=true         # 2 methods, 1 seed, a few steps (the test)
    python -m pipelines.peers_study report_only=true   # the table and figure again (e.g. after
                                                       # make bench-peers-cluster)
    make peers-study [QUICK=1]

Every (method, seed) is one ordinary pretrain run of ``conf/experiment/peers_gpt345m_owt``
(same model, data, batch, ranks and schedule; finished runs are skipped, so the study
resumes), then :func:`report` writes ``<out_dir>/``: README.md (the table), peers.csv,
peers.json and ``loss_vs_bytes.png`` (validation loss against cumulative bytes sent per rank).
Step times on the emulated cluster come from ``make bench-peers-cluster`` (1 Gbit/s:
``<out_dir>/cluster.json``; 100 Mbit/s, communication-bound at this model size:
``cluster_100mbit.json``); without those files the time columns say "not measured".
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pipelines.training.config import ConfigError, compose
from pipelines.training.tracking import METRICS_FILE, read_metrics

__all__ = ["MethodResult", "PeersStudyConfig", "report", "run", "summarize_method"]

REFERENCE = "adams"
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


@dataclass
class MethodResult:
    method: str
    label: str
    seeds: int
    final_val_loss: float
    final_val_loss_std: float
    bytes_per_step: float  # per rank, mean over the run (warm-up phases included)
    curve: list[tuple[float, float]]  # (cumulative bytes per rank, seed-mean val loss)
    eval_steps: list[int]
    diverged: int = 0  # seeds whose final validation loss is not finite (left out of the means)
    step_time_s: dict[str, float] = field(default_factory=dict)  # link -> median step time
    time_to_target_s: dict[str, float] = field(default_factory=dict)  # link -> seconds
    steps_to_target: int | None = None


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


def summarize_method(method: str, label: str, runs: list[list[dict[str, Any]]]) -> MethodResult:
    """Seed statistics of one method from its runs' metrics records."""
    finals, per_step, curves, diverged = [], [], [], 0
    for records in runs:
        totals = [sum(r["bytes"].values()) for r in records]
        per_step.append(sum(totals) / len(totals))
        final = next(r["val_loss"] for r in reversed(records) if "val_loss" in r)
        if not math.isfinite(final):
            diverged += 1
            continue
        finals.append(final)
        cumulative, curve = 0.0, {}
        for r, sent in zip(records, totals, strict=True):
            cumulative += sent
            if "val_loss" in r:
                curve[int(r["step"])] = (cumulative, float(r["val_loss"]))
        curves.append(curve)
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    mean_curve = [
        (statistics.fmean(c[s][0] for c in curves), statistics.fmean(c[s][1] for c in curves))
        for s in steps
    ]
    return MethodResult(
        method=method,
        label=label,
        seeds=len(runs),
        final_val_loss=statistics.fmean(finals) if finals else math.nan,
        final_val_loss_std=statistics.stdev(finals) if len(finals) > 1 else 0.0,
        bytes_per_step=statistics.fmean(per_step),
        curve=mean_curve,
        eval_steps=steps,
        diverged=diverged,
    )


def _link(cluster: dict[str, Any]) -> str:
    return cluster.get("link", {}).get("label") or "emulated cluster"


def _attach_times(results: list[MethodResult], clusters: list[dict[str, Any]]) -> None:
    """Steps to reach dense AdamS's final loss (seed means), and that time on each cluster."""
    target = next(r for r in results if r.method == REFERENCE).final_val_loss
    for r in results:
        reached = [s for s, (_, loss) in zip(r.eval_steps, r.curve, strict=True) if loss <= target]
        r.steps_to_target = reached[0] if reached else None
        for cluster in clusters:
            step_time = cluster.get("methods", {}).get(r.method, {}).get("step_time_s")
            if step_time is None:
                continue
            r.step_time_s[_link(cluster)] = step_time
            if r.steps_to_target is not None:
                r.time_to_target_s[_link(cluster)] = r.steps_to_target * step_time


def _table(results: list[MethodResult], links: list[str]) -> str:
    ref = next(r for r in results if r.method == REFERENCE)
    links = links or ["emulated cluster"]
    head = (
        "| method | final val loss (mean ± sd, n) | vs AdamS | kB/rank/step | AdamS bytes / this |"
        + "".join(f" step time, {link} (ms) |" for link in links)
        + " steps to AdamS's loss |"
        + "".join(f" time to AdamS's loss, {link} (s) |" for link in links)
    )
    lines = [head, "|" + "---|" * (6 + 2 * len(links))]
    for r in results:
        gap = 100.0 * (r.final_val_loss / ref.final_val_loss - 1.0)
        gap_text = f"{gap:+.2f}%" if math.isfinite(gap) else "-"
        step_ms = [
            f"{1000 * r.step_time_s[k]:.0f}" if k in r.step_time_s else "not measured"
            for k in links
        ]
        steps = str(r.steps_to_target) if r.steps_to_target is not None else "never"
        tt = [
            f"{r.time_to_target_s[k]:.1f}"
            if k in r.time_to_target_s
            else ("never" if r.steps_to_target is None else "not measured")
            for k in links
        ]
        loss = f"{r.final_val_loss:.3f} ± {r.final_val_loss_std:.3f} ({r.seeds - r.diverged})"
        if r.diverged:
            loss = f"diverged in {r.diverged} of {r.seeds} seeds" + (
                f"; others {loss}" if r.diverged < r.seeds else ""
            )
        lines.append(
            f"| {r.label} | {loss} "
            f"| {gap_text} | {r.bytes_per_step / 1e3:,.1f} "
            f"| {ref.bytes_per_step / r.bytes_per_step:.1f} | {' | '.join(step_ms)} | {steps} "
            f"| {' | '.join(tt)} |"
        )
    return "\n".join(lines)


def _plot(results: list[MethodResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        xs = [b / 1e6 for b, _ in r.curve]
        ax.plot(xs, [loss for _, loss in r.curve], marker="o", markersize=3, label=r.label)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative MB sent per rank (log)")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.set_title("Validation loss against bytes sent")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    runs: list[tuple[str, int, Any]], out_dir: Path, cluster_jsons: list[Path], command: str
) -> list[MethodResult]:
    """Write the table, CSV, JSON and figure for finished runs; returns the rows."""
    from pipelines.training.runs import run_dir_of

    by_method: dict[str, list[list[dict[str, Any]]]] = {}
    labels: dict[str, str] = {}
    for method, _seed, cfg in runs:
        by_method.setdefault(method, []).append(read_metrics(run_dir_of(cfg) / METRICS_FILE))
        labels[method] = cfg.optimizer.label
    results = [summarize_method(m, labels[m], rs) for m, rs in by_method.items()]
    clusters = [json.loads(p.read_text()) for p in cluster_jsons if p.is_file()]
    _attach_times(results, clusters)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = _table(results, [_link(c) for c in clusters])
    (out_dir / "peers.md").write_text(table + "\n")
    (out_dir / "peers.json").write_text(
        json.dumps({"command": command, "results": [vars(r) for r in results]}, indent=1)
    )
    with open(out_dir / "peers.csv", "w") as f:
        f.write("method,label,seeds,diverged,final_val_loss,sd,bytes_per_step,steps_to_target,step_time_s,time_to_target_s\n")  # fmt: skip
        for r in results:
            f.write(
                f"{r.method},{r.label},{r.seeds},{r.diverged},{r.final_val_loss:.5f},"
                f"{r.final_val_loss_std:.5f},{r.bytes_per_step:.0f},{r.steps_to_target or ''},"
                f'"{json.dumps(r.step_time_s)}","{json.dumps(r.time_to_target_s)}"\n'
            )
    _plot(results, out_dir / "loss_vs_bytes.png")
    return results


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
