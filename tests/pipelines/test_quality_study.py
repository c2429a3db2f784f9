"""The quality study stage: quick mode, the run plan, and a real quick run (with resume)
end to end. The study's config, runs and report: tests/pipelines/studies/.

Megatron-backed runs go through the command line in a subprocess: they need a process
group and Megatron's global state, which must not leak into the other tests' process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.quality_study import plan_runs
from pipelines.studies.protocol import record_equivalence

ROOT = Path(__file__).resolve().parents[2]


def test_quick_folds_in_its_scale_variants_seeds_and_output(compose_study) -> None:
    cfg = compose_study("quick=true")
    assert cfg.scale.name == "quick" and cfg.seeds == [0] and cfg.ablation_seeds == [0]
    assert list(cfg.variants) == ["adams", "r0_99", "scape99"]
    assert cfg.out_dir == "outputs/quality_quick"
    with pytest.raises(ValueError, match="unknown variants"):
        compose_study("quick=true", "quick_variants=[nope]")


def test_plan_runs_core_seeds_first_then_ablations(compose_study) -> None:
    cfg = compose_study("seeds=[0,1]", "ablation_seeds=[5]", "only_models=[llama]")
    plan = plan_runs(cfg)
    n_core = sum(v.core and not v.lr_of for v in cfg.variants.values())  # lr_of: none yet
    n_abl = sum(not v.core for v in cfg.variants.values())
    assert len(plan) == 2 * n_core + n_abl
    assert [s.seed for s in plan] == [0] * n_core + [1] * n_core + [5] * n_abl
    assert all(s.variant.core for s in plan[: 2 * n_core])
    assert len({s.run_id for s in plan}) == len(plan)
    grid = plan_runs(
        compose_study("lr_scales=[0.5,2]", "only_models=[llama]", "only_variants=[adams]")
    )
    assert [s.run_id for s in grid] == [
        "llama__adams__s0__t300__lr0.5",
        "llama__adams__s0__t300__lr2",
    ]


def test_a_variant_with_lr_of_runs_at_the_other_variants_chosen_lr_or_waits(compose_study):
    """The bf16 wire runs at the lr chosen for the fp32 wire (one run per seed), and not at all
    while that lr is unknown; the other variants keep the grid."""
    cfg = compose_study("seeds=[0,1]", "lr_scales=[0.5,1,2]", "only_models=[llama,gpt]",
                        "only_variants=[scape90,scape90_bf16]")  # fmt: skip
    chosen = {"llama": 0.5, "gpt": None}
    plan = plan_runs(cfg, lambda model, variant: chosen[model] if variant == "scape90" else 9.0)
    bf16 = [s.run_id for s in plan if s.variant_name == "scape90_bf16"]
    assert bf16 == ["llama__scape90_bf16__s0__t300__lr0.5", "llama__scape90_bf16__s1__t300__lr0.5"]
    assert sum(s.variant_name == "scape90" for s in plan) == 2 * 2 * 3
    assert [s for s in plan_runs(cfg) if s.variant_name == "scape90_bf16"] == []


def _finished(runs: Path, spec, loss: float) -> None:
    header = {"model": spec.model.name, "variant": spec.variant_name, "seed": spec.seed,
              "steps": spec.scale.steps, "lr_scale": spec.lr_scale,
              "code": {"commit": None, "dirty": False, "step_code": "v1"}}  # fmt: skip
    lines = [header, {"step": 1, "loss": loss}, {"event": "final", "final_val_loss": loss}]
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"{spec.run_id}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_grids_are_extended_past_an_edge_choice_on_every_seed(compose_study, tmp_path) -> None:
    """AdamS's best mean loss is at its grid's top (x1): x2 is planned for both seeds; SCAPE-99
    is best inside its grid: nothing more. Only the code version's own runs count."""
    from pipelines.quality_study import grid_extensions

    cfg = compose_study("seeds=[0,1]", "lr_scales=[0.5,1,2]", "only_models=[llama]",
                        "only_variants=[adams,scape99]")  # fmt: skip
    plan = plan_runs(cfg)
    loss = {("adams", 0.5): 4.5, ("adams", 1.0): 4.2, ("scape99", 0.5): 4.6,
            ("scape99", 1.0): 4.4, ("scape99", 2.0): 4.9}  # fmt: skip
    for spec in plan:
        if (spec.variant_name, spec.lr_scale) in loss:
            _finished(tmp_path / "runs" / "v1", spec, loss[spec.variant_name, spec.lr_scale])
    more = grid_extensions(cfg, plan, tmp_path, "v1")
    assert sorted(s.run_id for s in more) == ["llama__adams__s0__t300__lr2",
                                              "llama__adams__s1__t300__lr2"]  # fmt: skip
    assert grid_extensions(cfg, plan, tmp_path, "v2") == []  # no runs of that version


# ---------------------------------------------------------------- end to end (subprocess)
def _quick(prepared_small: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "pipelines.quality_study", "quick=true",
        f"data_dir={prepared_small}", f"quick_out_dir={out}", f"cache_dir={out.parent / 'cache'}",
        "only_models=[llama]", "quick_variants=[adams,r0ef_99]",
        "quick_scale.steps=12", "quick_scale.eval_interval=5", "quick_scale.val_max_sequences=16",
        f"hydra.run.dir={out.parent / 'hydra'}", f"replay_dir={out.parent / 'replays'}", *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_quick_study_end_to_end_then_resumes_deterministically(
    prepared_small: Path, tmp_path: Path
):
    out = tmp_path / "out"
    _quick(prepared_small, out, "final_test=true")
    (runs,) = (out / "runs").iterdir()  # one folder: this code version's runs
    names = sorted(p.name for p in runs.iterdir())
    assert names == [f"llama__{v}__s0__t12.jsonl" for v in ("adams", "r0ef_99")]
    for name in ("summary.md", "runs.csv", "loss_llama_t12.png"):
        assert (out / name).stat().st_size > 0
    recs = _records(runs / "llama__r0ef_99__s0__t12.jsonl")
    header, steps, final = recs[0], recs[1:-1], recs[-1]
    assert header["variant"] == "r0ef_99" and header["params"] > 0
    assert header["steps"] == 12 and header["lr_scale"] == 1.0
    # stamped with the code that ran it; its folder is named by that code version
    assert header["code"]["step_code"] == runs.name and len(header["code"]["commit"]) == 40
    # a record every LOG_EVERY (10) steps, at every validation point and at the end
    assert [s["step"] for s in steps] == [5, 10, 12]
    assert [s["step"] for s in steps if "val_loss" in s] == [5, 10, 12]
    for key in ("tokens", "loss", "lr", "grad_norm", "bytes"):
        assert all(key in s for s in steps), key
    assert steps[-1]["tokens"] == 12 * 4 * 2 * 32
    assert abs(final["final_val_loss"] - steps[-1]["val_loss"]) < 0.5 and not final["diverged"]
    # final_test=true: the whole test split's loss too, another split's
    assert 0 < final["final_test_loss"] < 10 and final["final_test_loss"] != final["final_val_loss"]
    assert steps[-1]["loss"] < steps[0]["loss"]  # it trains
    dense = _records(runs / "llama__adams__s0__t12.jsonl")
    assert dense[-2]["bytes"] > 50 * steps[-1]["bytes"]  # 99% sparse sends far less
    summary = (out / "summary.md").read_text()
    assert "R0-99 EF" in summary and "0 (reference)" in summary

    # Resume: a finished run is kept; an interrupted one (only its .partial file, cut short)
    # is redone from scratch, and the redo reproduces the original numbers exactly.
    kept = (runs / "llama__adams__s0__t12.jsonl").read_text()
    done = runs / "llama__r0ef_99__s0__t12.jsonl"
    cut = "".join(done.read_text().splitlines(keepends=True)[:5])
    done.unlink()
    (runs / "llama__r0ef_99__s0__t12.jsonl.partial").write_text(cut)
    _quick(prepared_small, out, "final_test=true")
    assert (runs / "llama__adams__s0__t12.jsonl").read_text() == kept
    assert not list(runs.glob("*.partial"))
    again = _records(runs / "llama__r0ef_99__s0__t12.jsonl")
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in again]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in recs]

    # Replay: the runs, stamped as if another code version had made them, are replayed with
    # this code. Same bits: the versions are recorded as one. One logged loss changed: not.
    # cafe00000000 was joined to feedbeef0000 by an earlier replay: replaying one of the two
    # joins both (the other is skipped)
    record_equivalence(out / "runs", {"code": "cafe00000000", "same_as": "feedbeef0000",
                                      "runs": [], "commit": None, "dirty": False})  # fmt: skip
    for fake, tamper in (("feedbeef0000", False), ("badbadbad000", True), ("cafe00000000", False)):
        (out / "runs" / fake).mkdir()
        for path in runs.glob("*.jsonl"):
            recs = _records(path)
            recs[0]["code"]["step_code"] = fake
            recs[2]["loss"] += 1e-9 if tamper and "r0ef" in path.name else 0.0
            (out / "runs" / fake / path.name).write_text(
                "".join(json.dumps(r) + "\n" for r in recs)
            )
    log = _quick(prepared_small, out, "replay=true", "final_test=true").stdout
    assert f"`{runs.name}` computes what `cafe00000000` did (2 runs, same bits)" in log
    assert f"`feedbeef0000` is joined to `{runs.name}` through another replay" in log
    assert f"`{runs.name}` does NOT compute what `badbadbad000` did (1 of 2 runs differ)" in log
    assert "llama__r0ef_99__s0__t12: step 10: loss" in log
    pairs = [
        (r["code"], r["same_as"])
        for r in json.loads((out / "runs" / "equivalent.json").read_text())
    ]
    assert sorted(pairs) == sorted([("cafe00000000", "feedbeef0000"), (runs.name, "cafe00000000")])
    assert "feedbeef0000" in (out / "summary.md").read_text()  # the report names the replay


RESUME_SCRIPT = """
import dataclasses, json, sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from pipelines.quality_study import resolve
from pipelines.studies.quality_config import RunSpec
from pipelines.studies.quality_data import load_study_data
from pipelines.studies.quality_run import init_megatron_single_process, train_run

repo, data_dir, out = sys.argv[1:4]
torch.set_num_threads(1)
with initialize_config_dir(config_dir=f"{repo}/conf", version_base="1.3"):
    cfg = resolve(compose(config_name="quality_study", overrides=[
        "quick=true", f"data_dir={data_dir}", "quick_scale.steps=24",
        "quick_scale.eval_interval=5", "quick_scale.val_max_sequences=16"]))
init_megatron_single_process()
s = cfg.scale
data = load_study_data(data_dir, seed=0, seq_length=s.seq_length, world_size=s.world_size,
                       batch_per_worker=s.batch_per_worker, steps=s.steps,
                       cache_dir=f"{out}/cache")
val, final = data.validation_batches(16, batch_size=64), data.validation_batches(None, 64)
code = {"commit": None, "dirty": False, "step_code": "v1"}
batches = data.data.rank_micro_batches  # what the loop's simulator engine reads


class Crash(Exception):
    pass


def crash_at_17(step, rank, micro_batch_size):
    if step == 17:
        raise Crash
    return batches(step, rank, micro_batch_size)


# every quick variant on the study's path; SCAPE-99 on the product path too (Megatron's
# scheduler and layout, 2 micro-batches per worker)
product = dataclasses.replace(s, path="product")
runs = [(name, s) for name in cfg.variants] + [("scape99", product)]
for name, scale in runs:
    spec = RunSpec(s.models[0], name, cfg.variants[name], 0, scale, data_dir)
    train_run(spec, data, val, final, Path(out) / "straight" / scale.path, code, checkpoint_s=0)
    data.data.rank_micro_batches = crash_at_17
    cut = Path(out) / "cut" / scale.path
    try:
        train_run(spec, data, val, final, cut, code, checkpoint_s=0)
    except Crash:
        saved = list((cut / f"{spec.run_id}.ckpt").glob("step_*/manifest.json"))
        print(scale.path, name, "crashed; checkpoint:", len(saved) == 1)
    data.data.rank_micro_batches = batches
    train_run(spec, data, val, final, cut, code, checkpoint_s=0)
"""


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_an_interrupted_run_resumes_from_its_checkpoint_bit_for_bit(prepared_small, tmp_path):
    """Each quick variant (dense AdamS, R0-99, SCAPE-99; SCAPE-99 on the product path too),
    crashed at step 17 of 24 with a checkpoint at every logged step, resumes at step 15 and
    logs what a straight run logs."""
    proc = subprocess.run(
        [sys.executable, "-c", RESUME_SCRIPT, str(ROOT), str(prepared_small), str(tmp_path)],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(str(p.relative_to(tmp_path / "straight"))
                   for p in (tmp_path / "straight").glob("*/*.jsonl"))  # fmt: skip
    assert len(names) == 4 and sum(n.startswith("product/") for n in names) == 1
    for name in names:
        path, run_id = name.removesuffix(".jsonl").split("/")
        assert f"{path} {run_id.split('__')[1]} crashed; checkpoint: True" in proc.stdout
        assert f"{run_id}: resuming at step 15 from its checkpoint" in proc.stdout
        straight, cut = (_records(tmp_path / d / name) for d in ("straight", "cut"))
        # the study's path is left out of the header's settings: code from before the path
        # existed rebuilds (replays) the run
        assert straight[0]["settings"]["scale"].get("path") == (None if path == "study" else path)
        assert [{k: v for k, v in r.items() if k != "seconds"} for r in cut] == [
            {k: v for k, v in r.items() if k != "seconds"} for r in straight
        ], name
    assert not list((tmp_path / "cut").glob("*/*.ckpt*"))  # a finished run leaves none
