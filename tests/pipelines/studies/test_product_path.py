"""The link from verdict to product: a study run at ``scale.path=product`` trains what a user's
``python -m pipelines.pretrain train.engine=simulator`` run of the same settings trains.

Both go through the one loop (:mod:`pipelines.training.loop`) and the simulator engine; the
product path takes the user's parameter layout (Megatron's buckets), lr schedule (Megatron's
scheduler) and micro-batch size. The shipped SCAPE-99 (density ramp, bf16 wire) must log the
same training losses, gradient norms and lrs, bit for bit, at every step the study logs. The
study's own path (the verdict's runs) differs from this in exactly those three choices
(``pipelines/studies/quality_run.py``).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.training.tracking import read_metrics

REPO = Path(__file__).resolve().parents[3]
STEPS = 20

STUDY_SCRIPT = """
import json, sys
from pathlib import Path

from pipelines.studies.quality_config import ModelSpec, RunSpec, ScaleConfig, VariantSpec
from pipelines.studies.quality_data import load_study_data
from pipelines.studies.quality_run import init_megatron_single_process, train_run

summary, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
c = summary["config"]
m, o, t, cl = c["model"], c["optimizer"], c["train"], c["cluster"]
world = cl["nodes"] * cl["ranks_per_node"]
model = ModelSpec(name=m["name"], family=m["family"], num_layers=m["num_layers"],
                  hidden_size=m["hidden_size"], num_attention_heads=m["num_attention_heads"],
                  ffn_hidden_size=m["ffn_hidden_size"], num_query_groups=m["num_query_groups"])
scale = ScaleConfig(name="as_pretrain", models=[model], world_size=world,
                    batch_per_worker=t["global_batch_size"] // world,
                    seq_length=m["seq_length"], steps=t["train_steps"],
                    warmup_steps=t["warmup_steps"], eval_interval=t["eval_interval"],
                    val_max_sequences=8, lr=o["lr"], min_lr=o["min_lr"], beta1=o["beta1"],
                    beta2=o["beta2"], eps=o["eps"], weight_decay=o["weight_decay"],
                    clip_grad=o["clip_grad"], path="product")
s = o["scape"]
variant = VariantSpec(method="scape", options={
    "sparsity": s["sparsity"], "value_dtype": s["value_dtype"],
    "ramp_start_sparsity": s["ramp_start_sparsity"], "ramp_fraction": s["ramp_fraction"]})
data_dir = str(Path(c["data_root"]) / f"{c['data']['name']}__{c['tokenizer']['name']}")
spec = RunSpec(model, "scape99", variant, t["seed"], scale, data_dir,
               lr_scale=o["lr_multiplier"])
init_megatron_single_process()
data = load_study_data(data_dir, seed=spec.seed, seq_length=scale.seq_length,
                       world_size=world, batch_per_worker=scale.batch_per_worker,
                       steps=scale.steps, cache_dir=out / "cache")
val = data.validation_batches(8, batch_size=8)
train_run(spec, data, val, val, out, {"step_code": "test"})
print(json.dumps(spec.variant.scape_config().__dict__, default=str))
"""


@pytest.mark.slow  # a whole stage or study run: make test-slow
def test_a_product_path_study_run_trains_what_the_pretrain_stage_trains(tmp_path, prepared_default):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "pipelines.pretrain", "optimizer=scape99",
         "train.engine=simulator", f"train.train_steps={STEPS}", "train.eval_interval=10",
         "train.warmup_steps=2", "model.num_layers=2", "wandb.mode=disabled", "progress=false",
         f"output_root={tmp_path / 'pretrain'}"],
        cwd=REPO, env=env, check=True, capture_output=True,
    )  # fmt: skip
    (run,) = (tmp_path / "pretrain" / "default").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["train"]["micro_batch_size"] == 2  # the product path's default
    user = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    proc = subprocess.run(
        [sys.executable, "-c", STUDY_SCRIPT, str(run / "summary.json"), str(tmp_path / "study")],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ramp = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ramp["ramp_start_k"] == 10 and ramp["ramp_steps"] >= 2  # the ramp is under test
    (log,) = (tmp_path / "study").glob("*.jsonl")
    study = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r for r in study if "step" in r and "event" not in r]
    assert [r["step"] for r in steps] == [10, 20]
    assert user[STEPS]["loss"] < user[1]["loss"] - 0.2  # it trains
    common = ["step", "tokens", "loss", "lr", "grad_norm", "skipped", "bytes"]
    for record in steps:
        mine = user[record["step"]]
        # one record format (pipelines.training.metrics): the same fields first, in order
        assert list(record)[: len(common)] == list(mine)[: len(common)] == common
        for key in common:
            assert record[key] == mine[key], (key, record["step"], record[key], mine[key])
        assert mine["bytes"] == sum(mine["bytes_by_kind"].values())
