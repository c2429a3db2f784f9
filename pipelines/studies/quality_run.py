"""One quality-study run: a Megatron GPTModel trained by the W-worker simulator.

The simulator (``scape.simulate``) is the project's oracle for SCAPE's numbers: W workers'
forward/backward on one model, each worker's own first moment and the one summed sparse
buffer every worker steps with (``scape.step``, as the Megatron adapter runs it), the
collectives replaced by sums in rank order. The model is Megatron-Core's GPTModel (the
project's training engine) in a one-rank gloo group with TP = PP = 1.

A run goes through the pretrain stage's loop (:func:`pipelines.training.loop.run_loop`) and
its simulator engine (:class:`~pipelines.training.simulator_engine.SimulatorEngine`), as a
user's ``train.engine=simulator`` run does, and saves and resumes in the pretrain stage's
checkpoint format. The study's own path (``scale.path=study``, the verdict's runs) differs from
a user's run in three choices: its schedule (:func:`lr_at`, whose cosine runs one step behind
Megatron's), its parameter layout (the simulator's contiguous one, not Megatron's buckets) and
one micro-batch per worker; ``scale.path=product`` takes the user's
(``tests/pipelines/studies/test_product_path.py``). Its step records and validation loss are
the pretrain stage's (:mod:`pipelines.training.metrics`); what it does with them (the
divergence rule, a record every :data:`LOG_EVERY` steps) is its own (:class:`_StudySteps`).

Resuming: a run writes ``<run_id>.jsonl.partial`` line by line and renames it to
``<run_id>.jsonl`` when it ends; a finished run whose header matches the settings is
skipped. Every ``checkpoint_s`` seconds of wall time (at a logged step) it also writes a
checkpoint under ``<run_id>.ckpt/`` (:func:`pipelines.training.checkpoint.save_training_state`:
the model, every attribute of the simulator that training changes, the schedule and the RNG),
with the divergence rule and how much of the log belongs to that step. An interrupted run
with a checkpoint of the same settings and code version resumes from it, bit for bit (the
larger models' runs take most of an hour); without one it starts again from step 0. The
study keeps each code version's runs in a folder of its own (``runs/<step code>/``,
:mod:`.protocol`), and the header records the commit: a run is skipped only when the same
code made it, and a checkpoint of other code is never resumed.

A record is written every :data:`LOG_EVERY` steps and at every validation point (the
divergence rule still sees every step): the committed logs stay small.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipelines.studies.quality_config import (
    DEFAULTS_UNHASHED,
    RunSpec,
    ScaleConfig,
    VariantSpec,
)
from pipelines.studies.quality_data import Batch, StudyData
from pipelines.training.checkpoint import (
    find_latest_valid,
    restore_training_state,
    save_training_state,
)
from pipelines.training.metrics import step_record, validation_loss
from pipelines.training.provenance import host_build
from scape.adams import AdamHParams
from scape.simulate import Simulator

__all__ = [
    "DivergenceRule",
    "build_simulator",
    "completed_log",
    "completed_run",
    "init_megatron_single_process",
    "lr_at",
    "train_run",
]

FINAL = "final"  # event of a run's last line
LOG_EVERY = 10  # steps between training-loss records
# what a reading with stale replicas (R3) reports in its final line: the oldest entry a
# replica held, in steps, and how far the replicas ended from the owners' values
STALENESS_KEYS = ("max_staleness", "replica_gap")


def init_megatron_single_process() -> None:
    """A world-1 gloo group and Megatron's TP = PP = 1 state (idempotent), CPU compat on."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from scape.megatron.cpu_compat import install_cpu_compat

    install_cpu_compat()
    if not dist.is_initialized():
        # An in-memory store needs no free port (other engineers' jobs share this machine).
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def model_shape(spec: RunSpec, vocab_size: int):
    """The run's :class:`scape.megatron.models.ModelShape`."""
    from scape.megatron.models import ModelShape

    m = spec.model
    return ModelShape(
        m.name,
        m.family,  # type: ignore[arg-type]
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        m.ffn_hidden_size,
        vocab_size,
        spec.scale.seq_length,
        num_query_groups=m.num_query_groups,
    )


def build_model(spec: RunSpec, vocab_size: int) -> nn.Module:
    """The run's GPTModel; weights depend only on the seed (CPU initialization)."""
    from megatron.core import tensor_parallel

    from scape.megatron.models import build_gpt_model

    torch.manual_seed(spec.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
    _, model = build_gpt_model(model_shape(spec, vocab_size), device=spec.scale.device)
    return model


def lr_at(step: int, scale: ScaleConfig) -> float:
    """The study's schedule: linear warm-up to ``lr`` over ``warmup_steps``, then a cosine
    that would reach ``min_lr`` one step after the last (Megatron's reaches it at the last)."""
    if step < scale.warmup_steps:
        return scale.lr * (step + 1) / scale.warmup_steps
    span = max(1, scale.steps - scale.warmup_steps)
    progress = min(1.0, (step - scale.warmup_steps) / span)
    return scale.min_lr + 0.5 * (scale.lr - scale.min_lr) * (1.0 + math.cos(math.pi * progress))


def completed_run(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The final record of a finished run with these settings, else None."""
    if not path.is_file():
        return None
    return completed_log(path.read_text(encoding="utf-8"), fingerprint)


def completed_log(text: str | None, fingerprint: str) -> dict[str, Any] | None:
    """:func:`completed_run` of a log's text (None: no log)."""
    lines = [] if text is None else text.splitlines()
    if not lines:
        return None
    header, last = json.loads(lines[0]), json.loads(lines[-1])
    if header.get("fingerprint") != fingerprint or last.get("event") != FINAL:
        return None
    return last


class DivergenceRule:
    """A run has diverged when its loss is non-finite, or when the training loss stays above
    log(vocab) + 1 (worse than guessing uniformly, plus a margin) for ``patience``
    consecutive steps. A single spike above that level does not end a run: a dense AdamS
    baseline was once stopped at step 33 by one spike (6.16 -> 8.20) it would have survived.
    """

    def __init__(self, vocab_size: int, patience: int = 20) -> None:
        self.level, self.patience = math.log(vocab_size) + 1.0, patience
        self.streak, self.spike_steps = 0, 0

    def diverged(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        over = loss > self.level
        self.spike_steps += int(over)
        self.streak = self.streak + 1 if over else 0
        return self.streak >= self.patience


def build_simulator(
    model: nn.Module,
    variant: VariantSpec,
    world_size: int,
    hparams: AdamHParams,
    layout: Any = None,
) -> Simulator:
    """The simulator that trains ``model`` as ``variant`` says: a reading's, or the library's
    (dense AdamS/AdamW, SCAPE). ``layout``: a :class:`scape.layout.FlatLayout` for SCAPE's
    shards (None: the simulator's contiguous one)."""
    if variant.method == "reading":
        if layout is not None:
            raise ValueError("scale.path=product: the readings run on the study's layout only; "
                             "use scale.path=study for them")  # fmt: skip
        from pipelines.studies.readings import ReadingConfig, build_reading_simulator

        reading = ReadingConfig(**variant.run_options())
        return build_reading_simulator(model, world_size, hparams, reading)
    return Simulator(model, world_size, method=variant.method, hparams=hparams,
                     scape=variant.scape_config(), layout=layout)  # fmt: skip


def _path_choices(spec: RunSpec, vocab_size: int) -> tuple[Any, int]:
    """The layout (None: the simulator's contiguous one) and micro-batch size of the run's
    ``scale.path``: the study's, or a user's ``train.engine=simulator`` run's defaults."""
    scale = spec.scale
    if scale.path == "study":
        return None, scale.batch_per_worker  # one micro-batch per worker
    from pipelines.training.config import TrainConfig
    from pipelines.training.simulator_engine import megatron_layout

    micro = min(TrainConfig.micro_batch_size, scale.batch_per_worker)
    if scale.batch_per_worker % micro:
        raise ValueError(f"scale.batch_per_worker={scale.batch_per_worker} is not a multiple of "
                         f"the pretrain stage's micro_batch_size {micro}: use a multiple")  # fmt: skip
    layout = megatron_layout(model_shape(spec, vocab_size), scale.world_size,
                             torch.device(scale.device), bucket_size=TrainConfig.bucket_size,
                             overlap_grad_reduce=TrainConfig.overlap_grad_reduce,
                             overlap_param_gather=TrainConfig.overlap_param_gather)  # fmt: skip
    return layout, micro


def _schedule(spec: RunSpec, optimizer: Any) -> Any:
    """The lr schedule of the run's ``scale.path`` over ``optimizer``'s param groups: the
    study's :func:`lr_at` or Megatron's scheduler, both scaled by the run's lr multiplier."""
    from pipelines.training.loop import FunctionSchedule, megatron_schedule

    scale, x = spec.scale, spec.lr_scale
    if scale.path == "study":
        return FunctionSchedule(optimizer, lambda t: lr_at(t, scale) * x)
    return megatron_schedule(optimizer, lr=scale.lr * x, min_lr=scale.min_lr * x,
                             warmup_steps=scale.warmup_steps, steps=scale.steps,
                             weight_decay=scale.weight_decay)  # fmt: skip


class _StudySteps:
    """The study's part of :func:`~pipelines.training.loop.run_loop`: its records (every
    :data:`LOG_EVERY` steps and every validation point), the divergence rule (which sees every
    step), the JSONL and wall-time checkpoints."""

    def __init__(self, spec: RunSpec, engine: Any, log: Any, rule: DivergenceRule,
                 val_batches: list[Batch], checkpoint: Any, checkpoint_s: float, *,
                 skipped: int = 0, last_val: float = float("nan")) -> None:  # fmt: skip
        """``skipped``, ``last_val``: a resumed run's skipped steps and latest validation loss."""
        self.spec, self.engine, self.log, self.rule = spec, engine, log, rule
        self.val_batches, self.checkpoint, self.checkpoint_s = val_batches, checkpoint, checkpoint_s
        scale = spec.scale
        self.tokens_per_step = scale.world_size * scale.batch_per_worker * scale.seq_length
        self.last_ckpt = time.perf_counter()
        self.skipped, self.diverged, self.last_val = skipped, False, last_val

    def write(self, record: dict[str, Any]) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()

    def record(self, step: int, lr: float, result: Any) -> dict[str, Any]:
        # one process is every rank: its loss is already the rank mean
        record = step_record(step, self.tokens_per_step, result.loss, lr, result,
                             self.engine.bytes_last_step())  # fmt: skip
        record.update(result.diagnostics)  # the simulator's overlap and moment norms
        self.skipped += int(not result.updated)
        return record

    def ends_run(self, record: dict[str, Any]) -> bool:
        self.diverged = self.rule.diverged(record["loss"])
        return self.diverged

    def evaluate(self) -> float:
        self.last_val = validation_loss(self.engine.model, self.val_batches)
        self.diverged = self.diverged or not math.isfinite(self.last_val)
        return self.last_val

    def finish_step(self, record: dict[str, Any], last: bool) -> bool:
        step = record["step"]
        if last or "val_loss" in record or step % LOG_EVERY == 0:
            self.write(record)
            if not last and time.perf_counter() - self.last_ckpt >= self.checkpoint_s:
                self.checkpoint(step)
                self.last_ckpt = time.perf_counter()
        return self.diverged  # nothing more to learn from a diverged run; counted as such


def train_run(
    spec: RunSpec,
    data: StudyData,
    val_batches: list[Batch],
    final_val_batches: list[Batch],
    out_dir: Path,
    code: dict[str, Any] | None = None,
    checkpoint_s: float = 300.0,
    final_test_batches: list[Batch] | None = None,
) -> dict[str, Any]:
    """Train one run through the pretrain stage's loop and simulator engine, writing its
    JSONL; return the final record. ``code``: the
    :func:`~pipelines.studies.protocol.code_version` the header records.

    ``val_batches`` (a fixed subset, cheap) give the curve every ``eval_interval`` steps;
    ``final_val_batches`` (the whole validation split) give the final validation loss.
    ``checkpoint_s``: wall seconds between checkpoints (0: at every logged step), from which
    an interrupted run resumes. ``final_test_batches`` (the whole test split, when given)
    give ``final_test_loss`` too: a study that chooses lr on validation reports on test.
    """
    from pipelines.training.loop import run_loop
    from pipelines.training.simulator_engine import SimulatorEngine

    out_dir.mkdir(parents=True, exist_ok=True)
    final_path = out_dir / f"{spec.run_id}.jsonl"
    done = completed_run(final_path, spec.fingerprint())
    if done is not None:
        return done
    scale = spec.scale
    model = build_model(spec, data.vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    hparams = AdamHParams(**{**scale.shared(), "lr": scale.lr * spec.lr_scale})
    layout, micro_batch_size = _path_choices(spec, data.vocab_size)
    engine = SimulatorEngine.around(build_simulator(model, spec.variant, scale.world_size,
                                                    hparams, layout))  # fmt: skip
    schedule = _schedule(spec, engine.optimizer)
    partial = out_dir / f"{spec.run_id}.jsonl.partial"
    # the pretrain stage's checkpoint format (pipelines.training.checkpoint), the newest kept
    ckpt = out_dir / f"{spec.run_id}.ckpt"
    start = time.perf_counter()
    first, skipped, last_val, before = 0, 0, float("nan"), 0.0
    rule = DivergenceRule(data.vocab_size)
    resumed = _resume_point(ckpt, partial, spec, code)
    if resumed is not None:
        common = restore_training_state(engine, schedule, resumed)
        vars(rule).update(common["rule"])
        first, skipped, last_val, before = (common[k] for k in ("step", "skipped", "last_val",
                                                                 "seconds"))  # fmt: skip
        print(f"{spec.run_id}: resuming at step {first} from its checkpoint", flush=True)

    def checkpoint(step: int) -> None:
        """Everything the steps after ``step`` read, beside the log so far."""
        extra = {
            "fingerprint": spec.fingerprint(), "step_code": (code or {}).get("step_code"),
            "skipped": steps.skipped, "last_val": steps.last_val,
            "seconds": before + time.perf_counter() - start,
            "log_bytes": partial.stat().st_size, "rule": dict(vars(rule)),
        }  # fmt: skip
        save_training_state(engine, schedule, step, ckpt, keep=1, extra=extra)

    with open(partial, "w" if resumed is None else "a", encoding="utf-8") as log:
        steps = _StudySteps(spec, engine, log, rule, val_batches, checkpoint, checkpoint_s,
                            skipped=skipped, last_val=last_val)  # fmt: skip
        if resumed is None:
            steps.write(
                {
                    "event": "header",
                    "run_id": spec.run_id,
                    "fingerprint": spec.fingerprint(),
                    "model": spec.model.name,
                    "family": spec.model.family,
                    "variant": spec.variant_name,
                    "seed": spec.seed,
                    "steps": scale.steps,
                    "lr_scale": spec.lr_scale,
                    "params": n_params,
                    "code": code,
                    # the CPU and torch build: equal configs move by ~1% between hosts
                    "host": host_build(),
                    "settings": {
                        "model": vars(spec.model),
                        "variant": vars(spec.variant),
                        # a setting at its unhashed default is left out, so code from
                        # before the setting can still rebuild (replay) the run
                        "scale": {
                            k: v
                            for k, v in vars(scale).items()
                            if k != "models" and (k, v) not in DEFAULTS_UNHASHED
                        },
                    },
                }
            )
        end = run_loop(engine, schedule, data.data, steps, start=first, steps=scale.steps,
                       eval_interval=scale.eval_interval,
                       micro_batch_size=micro_batch_size)  # fmt: skip
        final_val = validation_loss(model, final_val_batches)
        sim = engine.simulator
        final = {
            "event": FINAL,
            "steps": end.step,
            "final_val_loss": final_val if math.isfinite(final_val) else steps.last_val,
            "diverged": steps.diverged,
            "skipped_steps": steps.skipped,
            "spike_steps": rule.spike_steps,
            # R3 (stale replicas): the oldest a replica entry got, and the largest relative
            # distance of a replica from the owners' values at the end
            **{k: getattr(sim, k) for k in STALENESS_KEYS if hasattr(sim, k)},
            "seconds": round(before + time.perf_counter() - start, 2),
        }
        scape_cfg = spec.variant.scape_config()
        if final_test_batches is not None:  # only then, so older runs replay unchanged
            final["final_test_loss"] = validation_loss(model, final_test_batches)
        if scape_cfg is not None and scape_cfg.ramp_start_k:
            # a ramp's steps send unequal bytes and only every LOG_EVERY-th is logged: its
            # whole run's (only a ramp's record carries it, so older runs replay unchanged)
            final["run_bytes"] = sim.run_bytes(end.step)
        steps.write(final)
    os.replace(partial, final_path)  # the rename marks the run finished
    shutil.rmtree(ckpt, ignore_errors=True)
    return final


def _resume_point(
    ckpt: Path, partial: Path, spec: RunSpec, code: dict[str, Any] | None
) -> Path | None:
    """The run's newest valid checkpoint when it can be resumed (same settings, same code
    version, its log still there), with the log cut back to the checkpoint's step; else None,
    and what cannot be resumed is removed (a single-file checkpoint of code before 2026-12-05
    too)."""
    if ckpt.is_file():
        ckpt.unlink()
    path = find_latest_valid(ckpt, 1)
    if path is None:
        shutil.rmtree(ckpt, ignore_errors=True)
        return None
    common = torch.load(path / "common.pt", weights_only=True)
    same = (common.get("fingerprint") == spec.fingerprint()
            and common.get("step_code") == (code or {}).get("step_code"))  # fmt: skip
    if not same or not partial.is_file() or partial.stat().st_size < common["log_bytes"]:
        shutil.rmtree(ckpt)
        return None
    with open(partial, "r+b") as log:
        log.truncate(common["log_bytes"])  # the records written after the checkpoint go
    return path
