"""Hydra stage: the loss-for-bytes frontier of SCAPE against its peers (issues 8 and 29),
through the pretrain stage itself, under the verdict's protocol.

    python -m pipelines.peers_study                    # every method x lr grid x 3 seeds (hours)
    python -m pipelines.peers_study quick=true         # AdamS and DGC-99, 1 seed, 1 lr, a few steps
    python -m pipelines.peers_study report_only=true   # the frontier and curves again
    make peers-study [QUICK=1]

Every (method, lr scale, seed) is one ordinary pretrain run of
``conf/experiment/<experiment>`` at ``<scale>`` with the study's ``overrides`` (same model,
data, batch, ranks and schedule) and ``optimizer.lr_multiplier`` times ``lr_scale``, in its
own directory ``<output_root>/<code version>/<experiment>/<run name>-lr<scale>-seed<seed>``.
The protocol of the verdict (:mod:`pipelines.studies.protocol`):

- each method's lr is the grid point with the lowest mean final loss over all its seeds
  (:func:`~pipelines.studies.protocol.choose_lr`); while that point is the grid's lowest or
  highest, the point x0.5 or x2 further out is run on every seed, up to ``close_grids`` times,
  and a grid still open is marked so in the table;
- one code version per table: the version is a digest of the files that compute a pretrain
  run's numbers (:data:`STUDY_SOURCES`, with the torch and megatron-core versions), and it
  names the directory its runs live in. A change to those files starts a new set of runs,
  and the report is made from one version's runs only (the current one after training; with
  ``report_only``, the one with the most finished runs), naming every commit they ran at
  (each run's ``provenance.json``) and counting the other versions' runs it left out.

Finished runs are skipped, so the study resumes. The records of the table's runs (metrics,
summary, provenance, config; no checkpoints) are packed into ``<out_dir>/runs.tar.xz``, which
``report_only`` unpacks under ``output_root`` first: a fresh checkout rewrites the report from
what is committed. The report
(:mod:`pipelines.studies.peers_report`) writes ``<out_dir>/frontier.{json,md,png}``, the
curves (``peers.*``, ``loss_vs_bytes.png``) and, in ``<out_dir>/README.md`` when it has the
markers, the generated frontier block.
"""

from __future__ import annotations

import copy
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from pipelines.stage import command_line, one_line_errors, register_schema
from pipelines.studies.peers_report import REFERENCE, StudyRun, final_val_loss, lr_choices, report
from pipelines.studies.protocol import step_code
from pipelines.training.config import ConfigError, PretrainConfig, compose

__all__ = [
    "STUDY_METHODS",
    "STUDY_SOURCES",
    "PeersStudyConfig",
    "grid_extensions",
    "plan_runs",
    "run",
    "study_code",
]

REPO = Path(__file__).resolve().parents[1]

# The files that compute a peers-study run's numbers: the optimizer library (less the
# simulator and the rank launcher; with the step, scape/step.py and its kernels), the peers' hooks, the Megatron adapter, and the pretrain
# stage's runtime (less provenance, run-directory, slot, Slurm and logging code). Conservative:
# a change anywhere in them, a rename included, starts a new code version.
STUDY_SOURCES = (
    *(f"scape/{n}.py" for n in ("__init__", "adams", "basis", "comm", "config", "layout", "shard",
                                "step", "fused")),
    *(f"scape/peers/{n}.py" for n in ("__init__", "buckets", "dgc", "onebit", "powersgd")),
    *(f"scape/megatron/{n}.py" for n in ("__init__", "bucket_group", "checkpoint", "cpu_compat",
                                          "dense", "layout", "models", "optimizer", "state", "train")),
    *(f"pipelines/training/{n}.py" for n in ("checkpoint", "config", "data", "engine",
                                              "engine_base", "loop", "megatron_engine", "metrics",
                                              "peer_engine", "trainer")),
)  # fmt: skip

QUICK_OVERRIDES = [
    "train.train_steps=6", "train.warmup_steps=2", "train.eval_interval=3",
    "train.checkpoint_interval=6", "model.num_layers=1",
]  # fmt: skip
QUICK_METHODS = [REFERENCE, "dgc99"]

# The setting (conf/peers_study.yaml says how it was chosen): the 1,024-entry byte-level BPE
# (data/enwiki_sample__bytebpe1k, `make peers-study` prepares it) and 400 steps.
STUDY_OVERRIDES = [
    "tokenizer.name=bytebpe1k", "tokenizer.vocab_size=1024", "model.vocab_size=1024",
    "train.train_steps=400", "train.eval_interval=50",
]  # fmt: skip

# The experiment's sweep (what `make bench-peers-cluster` times) and dense AdamW.
STUDY_METHODS = ["adams", "adamw", "scape90", "scape99", "powersgd_r1", "powersgd_r2",
                 "powersgd_r4", "dgc90", "dgc99", "onebit"]  # fmt: skip

PAPER_SHAPES = (("GPT-345M", "gpt-345m"), ("Llama-1.8B", "llama-1.8b"))
PAPER_WORLD_SIZE = 32


@dataclass
class PeersStudyConfig:
    experiment: str = "peers_gpt345m_owt"
    scale: str = "tiny"
    methods: list[str] = field(default_factory=lambda: list(STUDY_METHODS))  # []: the sweep
    seeds: list[int] = field(default_factory=lambda: [1234, 1235, 1236])
    lr_scales: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    close_grids: int = 5  # rounds of grid extension (x0.5 / x2 on every seed) at most
    overrides: list[str] = field(default_factory=lambda: list(STUDY_OVERRIDES))
    output_root: str = "runs/peers"
    out_dir: str = "results/peers"
    # Emulated-cluster results (make bench-peers-cluster), one pair of time columns each in
    # peers.md; relative to out_dir, missing files skipped.
    cluster_jsons: list[str] = field(
        default_factory=lambda: ["cluster.json", "cluster_100mbit.json"]
    )
    quick: bool = False  # QUICK_METHODS, the first seed, one lr (grids stay open), 6 steps
    progress: bool = True
    report_only: bool = False  # rewrite the report from finished runs, train nothing


def study_code(repo: Path | str = REPO) -> str:
    """The code version of a peers run: :func:`~pipelines.studies.protocol.step_code` of
    :data:`STUDY_SOURCES`."""
    return step_code(repo, STUDY_SOURCES)


def _resolved(cfg: PeersStudyConfig) -> PeersStudyConfig:
    if not cfg.quick:
        return cfg
    return PeersStudyConfig(**{
        **vars(cfg), "methods": list(QUICK_METHODS), "seeds": list(cfg.seeds[:1]),
        "lr_scales": [1.0], "close_grids": 0, "overrides": list(QUICK_OVERRIDES),
    })  # fmt: skip


@functools.lru_cache(maxsize=64)
def _compose(overrides: tuple[str, ...]) -> PretrainConfig:
    return compose(list(overrides))


class _Planner:
    """Makes the study's runs: one composed config per method, copied per (lr, seed)."""

    def __init__(self, cfg: PeersStudyConfig, code: str):
        self.cfg, self.code = cfg, code
        self.base = (f"experiment={cfg.experiment}", f"scale={cfg.scale}", *cfg.overrides)

    def methods(self) -> list[str]:
        methods = list(self.cfg.methods) or list(_compose(self.base).sweep)
        if REFERENCE not in methods:
            raise ConfigError(f"methods={methods} must include {REFERENCE} (the reference)")
        return methods

    def make(self, method: str, lr_scale: float, seed: int) -> StudyRun:
        from pipelines.training.runs import run_dir_of
        from pipelines.training.tracking import run_name

        run_cfg = copy.deepcopy(_compose((*self.base, f"optimizer={method}")))
        run_cfg.train.seed = seed
        run_cfg.optimizer.lr_multiplier *= lr_scale
        run_cfg.output_root = str(Path(self.cfg.output_root) / self.code)
        run_cfg.progress = self.cfg.progress
        run_cfg.run_name = run_name(run_cfg).replace(f"-seed{seed}", f"-lr{lr_scale:g}-seed{seed}")
        return StudyRun(
            method, run_cfg.optimizer.label, lr_scale, seed, run_dir_of(run_cfg), run_cfg
        )


def plan_runs(cfg: PeersStudyConfig, code: str) -> list[StudyRun]:
    """Every method at every grid point, seed by seed (an interrupted study has whole seeds)."""
    planner = _Planner(cfg, code)
    methods = planner.methods()
    return [planner.make(m, lr, s) for s in cfg.seeds for m in methods for lr in cfg.lr_scales]


def grid_extensions(cfg: PeersStudyConfig, runs: list[StudyRun], code: str) -> list[StudyRun]:
    """The runs that close each method's grid one step further: where the chosen lr (over the
    finished runs, :func:`~pipelines.peers_report.lr_choices`) is the grid's lowest or
    highest point, the point half or twice as large on every seed of the method; none for a
    method whose grid is closed or with a run of ``runs`` not finished (its choice may move)."""
    planner, have = _Planner(cfg, code), {(r.method, r.lr_scale, r.seed) for r in runs}
    pending = {r.method for r in runs if final_val_loss(r) is None}
    more = []
    for method, choice in lr_choices(runs).items():
        if choice is None or choice.closed or method in pending:
            continue
        lr = choice.lr / 2 if choice.lr == choice.grid[0] else choice.lr * 2
        more += [planner.make(method, lr, s) for s in choice.seeds if (method, lr, s) not in have]
    return more


def _versions(cfg: PeersStudyConfig, current: str) -> dict[str, list[StudyRun]]:
    """Every code version with runs under ``output_root`` -> its plan with the extensions it
    ran (the current version first)."""
    root = Path(cfg.output_root)
    found = (
        sorted(d.name for d in root.iterdir() if (d / cfg.experiment).is_dir())
        if root.is_dir()
        else []
    )
    out = {}
    for code in dict.fromkeys([current, *found]):
        runs = plan_runs(cfg, code)
        for _ in range(cfg.close_grids):
            more = [r for r in grid_extensions(cfg, runs, code) if final_val_loss(r) is not None]
            if not more:
                break
            runs += more
        out[code] = runs
    return out


def _train(runs: list[StudyRun], label: str) -> None:
    from pipelines.pretrain import run as pretrain

    for i, r in enumerate(runs, 1):
        print(f"[{label}{i}/{len(runs)}] {r.label} lr x{r.lr_scale:g} seed {r.seed}", flush=True)
        result = pretrain(r.cfg)
        if result.get("status") not in ("finished", "already finished"):
            raise RuntimeError(f"{r.run_dir} did not finish: {result}")


def _setting(cfg: PeersStudyConfig, ref: PretrainConfig) -> dict[str, Any]:
    from scape.megatron.models import SHAPES, count_params

    t = ref.train
    return {
        "experiment": cfg.experiment, "scale": cfg.scale, "model": ref.model.name,
        "params": count_params(_shape(ref)), "vocab": ref.model.vocab_size,
        "tokenizer": ref.tokenizer.name, "data": f"{ref.data_root}/{ref.data.name}__{ref.tokenizer.name}",
        "steps": t.train_steps, "warmup_steps": t.warmup_steps, "ranks": ref.cluster.world_size,
        "tokens_per_step": t.global_batch_size * ref.model.seq_length, "lr": ref.optimizer.lr,
        "seeds": list(cfg.seeds), "lr_scales": list(cfg.lr_scales), "overrides": list(cfg.overrides),
        "paper_shapes": [{"name": name, "shape": key, "params": count_params(SHAPES[key]),
                          "world_size": PAPER_WORLD_SIZE} for name, key in PAPER_SHAPES],
    }  # fmt: skip


def _shape(cfg: PretrainConfig):
    from scape.megatron.models import ModelShape

    m = cfg.model
    return ModelShape(m.name, m.family, m.num_layers, m.hidden_size, m.num_attention_heads,
                      m.ffn_hidden_size, m.vocab_size, m.seq_length, m.num_query_groups)  # fmt: skip


def _bytes(runs: list[StudyRun]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per method: the steady-state byte formula at the paper's shapes and at the run's own."""
    from pipelines.studies.peers_bytes import method_bytes
    from scape.megatron.models import SHAPES

    projections, here = {}, {}
    for r in {r.method: r for r in runs}.values():
        o = r.cfg.optimizer
        projections[r.method] = {
            name: method_bytes(o, SHAPES[key], PAPER_WORLD_SIZE) for name, key in PAPER_SHAPES
        }
        here[r.method] = method_bytes(o, _shape(r.cfg), r.cfg.cluster.world_size)
    return projections, here


# What a run keeps in the committed archive: its records, not its checkpoints or exports.
PACKED_FILES = ("metrics.jsonl", "summary.json", "provenance.json", "config.yaml")
RUNS_ARCHIVE = "runs.tar.xz"


def pack_runs(runs: list[StudyRun], output_root: Path, archive: Path) -> Path:
    """The records of ``runs`` (:data:`PACKED_FILES`, paths relative to ``output_root``) into
    one xz tar, written atomically: committed beside the report, so every lr choice and gap
    in it can be checked and the report rewritten (:func:`unpack_runs`)."""
    import tarfile

    tmp = archive.with_name(f".{archive.name}.tmp")
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tmp, "w:xz") as tar:
        for r in sorted(runs, key=lambda r: str(r.run_dir)):
            for name in PACKED_FILES:
                path = r.run_dir / name
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(output_root)))
    tmp.replace(archive)
    return archive


def unpack_runs(archive: Path, output_root: Path) -> int:
    """:func:`pack_runs`' archive back under ``output_root`` (files already there are kept);
    returns how many files it wrote."""
    import tarfile

    written = 0
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            target = output_root / member.name
            if member.isfile() and not target.exists():
                tar.extract(member, output_root, filter="data")
                written += 1
    return written


def run(cfg: PeersStudyConfig | DictConfig, command: str | None = None) -> dict[str, Any]:
    """Train (or skip, when finished) every planned run and the grids' extensions, then write
    the report; returns the frontier's JSON."""
    from data_prep.dataset import prepared_dir
    from data_prep.unigram import split_unigram_entropy
    from pipelines.studies.protocol import verdict_code

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)
    cfg = _resolved(cfg)
    current = study_code()
    archive = Path(cfg.out_dir) / RUNS_ARCHIVE
    if cfg.report_only and archive.is_file():  # the committed records, on a fresh checkout
        unpack_runs(archive, Path(cfg.output_root))
    if not cfg.report_only:
        runs = plan_runs(cfg, current)
        _train(runs, "")
        for extension in range(1, cfg.close_grids + 1):
            more = grid_extensions(cfg, runs, current)
            if not more:
                break
            _train(more, f"closing grids, round {extension}: ")
            runs += more
    versions = _versions(cfg, current)
    finished = {c: sum(final_val_loss(r) is not None for r in rs) for c, rs in versions.items()}
    code = current
    if cfg.report_only:
        code = verdict_code([c for c, n in finished.items() for _ in range(n)]) or current
    runs = versions[code]
    others = {c: n for c, n in finished.items() if c != code and n}
    ref = next(r for r in runs if r.method == REFERENCE)
    data = prepared_dir(ref.cfg.data_root, ref.cfg.data.name, ref.cfg.tokenizer.name)
    unigram = {**split_unigram_entropy(data), "split": "train", "data": str(data)}
    projections, here = _bytes(runs)
    out_dir = Path(cfg.out_dir)
    command = command or ("python -m pipelines.peers_study " + " ".join(sys.argv[1:])).strip()
    doc = report(
        runs, out_dir, [out_dir / p for p in cfg.cluster_jsons], command,
        code={"version": code, "current": current, "other_versions": others},
        setting=_setting(cfg, ref.cfg), unigram=unigram, projections=projections,
        formula_here=here, readme=out_dir / "README.md",
    )  # fmt: skip
    pack_runs(runs, Path(cfg.output_root), archive)
    print((out_dir / "frontier.md").read_text(encoding="utf-8"))
    print(
        f"written: {out_dir}/frontier.json, frontier.md, frontier.png, peers.*, loss_vs_bytes.png, "
        f"{RUNS_ARCHIVE} (the runs' records)"
    )
    return doc


register_schema("peers_study", PeersStudyConfig)


@hydra.main(config_path="../conf", config_name="peers_study", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from data_prep.errors import DataPrepError

    hint = "; prepare the data first (make peers-study does)"
    with one_line_errors(ConfigError), one_line_errors(DataPrepError, status=1, hint=hint):
        run(cfg, command_line("pipelines.peers_study"))


if __name__ == "__main__":
    main()
