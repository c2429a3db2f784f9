"""The prefetch stage, with the network boundary (datasets / huggingface_hub) standing in.

No test here reaches the hub: fetching is checked through mocks of `datasets.load_dataset`
and `huggingface_hub.hf_hub_download`, the offline path against a cache written by
`datasets`' own builder in the layout a hub download leaves.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.prefetch import PrefetchConfig, PrefetchError, plan, run
from pipelines.training.config import compose

REPO = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"
QUALITY = ["gpt345m_owt_quality", "llama500m_slimpj_quality"]
# the paper's zero-shot tasks as lm-eval's own task configs name their data
TASK_DATA = [
    ("EleutherAI/lambada_openai", "default"),
    ("Rowan/hellaswag", None),
    ("baber/piqa", None),
    ("allenai/ai2_arc", "ARC-Easy"),
    ("allenai/ai2_arc", "ARC-Challenge"),
    ("allenai/winogrande", "winogrande_xl"),
]


@pytest.fixture
def network(monkeypatch):
    """Record every download instead of making it."""
    import datasets
    import huggingface_hub

    from data_prep import assets

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(("dataset", a, k)))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda *a, **k: calls.append(("file", a, k)))  # fmt: skip
    monkeypatch.setattr(assets, "fetch_gpt2_asset", lambda *a, **k: calls.append(("asset", a, k)))
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    return calls


def test_asks_for_exactly_the_datasets_and_revisions_the_configs_name(tmp_path, network):
    home = str(tmp_path / "hf")
    cfg = PrefetchConfig(experiments=QUALITY, overrides=[f"data.hub_revision={SHA}"], hf_home=home)
    report = run(cfg)
    corpora = [compose([f"experiment={e}"]).data for e in QUALITY]
    expected = [
        ("dataset", (d.hub_name, None),
         {"revision": SHA, "cache_dir": f"{home}/datasets", "split": d.hub_split})
        for d in corpora
    ] + [
        ("dataset", (path, name), {"revision": None, "cache_dir": f"{home}/datasets"})
        for path, name in TASK_DATA
    ]  # fmt: skip
    assert [c for c in network if c[0] == "dataset"] == expected
    assert [c[1][0] for c in network if c[0] == "dataset"][:2] == [
        "Skylion007/openwebtext", "DKYoon/SlimPajama-6B"
    ]  # fmt: skip
    assert len(report.fetched) == 8 and not report.missing
    # the GPT-2 BPE and the 32k SentencePiece model come with the venv, not the hub
    assert {i.name for i, _ in report.have} == {
        "gpt2 (GPT-2 BPE asset)", "llama_sp32k (mistral_common)"
    }  # fmt: skip


def test_a_hub_tokenizer_is_its_tokenizer_json_at_its_revision(tmp_path, network):
    cfg = PrefetchConfig(
        experiments=["gpt345m_owt_quality"], tasks=[], hf_home=str(tmp_path),
        overrides=["tokenizer=hf", "tokenizer.hf_name=org/tok", "tokenizer.hf_revision=r1"],
    )  # fmt: skip
    run(cfg)
    assert [c for c in network if c[0] == "file"] == [
        ("file", ("org/tok", "tokenizer.json"), {"revision": "r1", "cache_dir": f"{tmp_path}/hub"})
    ]


def test_dry_run_lists_and_fetches_nothing(tmp_path, network):
    cfg = PrefetchConfig(experiments=QUALITY, hf_home=str(tmp_path), dry_run=True)
    report = run(cfg)
    assert network == []
    assert [i.name for i in report.missing][:2] == [
        "Skylion007/openwebtext",
        "DKYoon/SlimPajama-6B",
    ]
    owt = report.missing[0]
    assert owt.size == compose(["experiment=gpt345m_owt_quality"]).data.hub_size
    assert owt.needed_by == ["gpt345m_owt_quality"] and owt.revision is None


def test_unknown_task_or_experiment_is_one_line(monkeypatch):
    from lm_eval.tasks._index import TaskIndex

    # an unknown task falls back to lm-eval's whole index (a minute): an empty one stands in
    monkeypatch.setattr(TaskIndex, "build", staticmethod(lambda paths, **kw: {}))
    with pytest.raises(PrefetchError, match="lm-eval has no task 'no_such_task'"):
        plan(PrefetchConfig(experiments=[], tasks=["no_such_task"]))
    with pytest.raises(PrefetchError, match="experiment=nope") as err:
        plan(PrefetchConfig(experiments=["nope"], tasks=[]))
    assert "\n" not in str(err.value)


def _cache_like_datasets(hf_home: Path, repo_id: str, config: str | None, split: str,
                         rows: list[dict], commit: str) -> None:  # fmt: skip
    """A dataset in HF_HOME/datasets as `load_dataset(repo_id, config)` leaves it: written by
    datasets' own builder, under <namespace>___<name>/<config>/<version>/<commit>/."""
    from datasets.packaged_modules.json.json import Json

    source = hf_home.parent / f"{repo_id.replace('/', '_')}-{split}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    builder = Json(cache_dir=str(hf_home / "datasets"), dataset_name=repo_id.split("/")[-1],
                   config_name=config, config_id=config or "default", hash=commit,
                   data_files={split: str(source)})  # fmt: skip
    builder.repo_id = repo_id  # a hub download names the cache after the repository
    builder._cache_dir = builder._build_cache_dir()
    builder.download_and_prepare()


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_offline_jobs_find_the_cache_and_name_what_is_missing(tmp_path):
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    docs = [{"text": f"Document {i} of the stand-in corpus. " * 20} for i in range(16)]
    _cache_like_datasets(hf_home, "DKYoon/SlimPajama-6B", None, "train", docs, SHA)
    _cache_like_datasets(hf_home, "allenai/ai2_arc", "ARC-Easy", "test", [{"q": "x"}], SHA)
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

    # a prepare job: the Llama experiment's corpus, read by the stage's streaming path offline
    prepare = subprocess.run(
        [sys.executable, "-m", "pipelines.prepare", "data=slimpajama_6b", "tokenizer=gpt2",
         "data.split_ratios=[0.5,0.25,0.25]", f"output_root={tmp_path / 'data'}", "num_proc=1",
         "progress=false"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert prepare.returncode == 0, prepare.stderr[-2000:]
    meta = json.loads((tmp_path / "data" / "slimpajama_6b__gpt2" / "metadata.json").read_text())
    assert sum(s["documents"] for s in meta["splits"].values()) == 16

    # the GPT experiment's corpus was never fetched: one line naming it and the fix
    missing = subprocess.run(
        [sys.executable, "-m", "pipelines.prepare", "data=openwebtext", "tokenizer=gpt2",
         f"output_root={tmp_path / 'data'}", "progress=false"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (line,) = [ln for ln in missing.stderr.splitlines() if ln.startswith("error:")]
    assert missing.returncode == 1
    assert "'Skylion007/openwebtext'" in line and "python -m pipelines.prefetch" in line

    # the stage itself, offline: what it has, and one error line per missing item
    check = subprocess.run(
        [sys.executable, "-m", "pipelines.prefetch", f"experiments=[{','.join(QUALITY)}]",
         "tasks=[arc_easy,hellaswag]", f"hf_home={hf_home}", "check=true"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert check.returncode == 1
    have = [ln for ln in check.stdout.splitlines() if ln.strip().startswith("have")]
    assert any("corpus DKYoon/SlimPajama-6B" in ln for ln in have)
    assert any("eval task allenai/ai2_arc, config ARC-Easy" in ln for ln in have)
    errors = [ln for ln in check.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 2
    assert any("corpus Skylion007/openwebtext" in e and "experiments=[gpt345m_owt_quality]" in e
               for e in errors)  # fmt: skip
    assert any("eval task Rowan/hellaswag" in e and "tasks=[hellaswag]" in e for e in errors)
    assert all(f"hf_home={hf_home}" in e for e in errors)
