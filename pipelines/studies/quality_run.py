"""One quality-study run: a Megatron GPTModel trained by the W-worker simulator.

The simulator (``scape.simulate``) is the project's oracle for SCAPE's numbers: W workers'
forward/backward on one model, their residuals and the owners' masked AdamS, with the
collectives replaced by sums in rank order. The model is Megatron-Core's GPTModel (the
project's training engine) in a one-rank gloo group with TP = PP = 1.

Resuming is per run: a run writes ``<run_id>.jsonl.partial`` line by line and renames it to
``<run_id>.jsonl`` when it ends; a finished run whose header matches the settings is
skipped, an unfinished one starts again from step 0 (runs here take a minute or two, and a
restart from scratch cannot mix two code versions in one curve). The study keeps each code
version's runs in a folder of its own (``runs/<step code>/``, :mod:`.protocol`), and the
header records the commit: a run is skipped only when the same code made it.

A record is written every :data:`LOG_EVERY` steps and at every validation point (the
divergence rule still sees every step): the committed logs stay small.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from pipelines.studies.quality_config import RunSpec, ScaleConfig, scape_config
from pipelines.studies.quality_data import Batch, StudyData
from scape.adams import AdamHParams
from scape.simulate import Simulator

__all__ = [
    "DivergenceRule",
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


def build_model(spec: RunSpec, vocab_size: int) -> nn.Module:
    """The run's GPTModel; weights depend only on the seed (CPU initialization)."""
    from megatron.core import tensor_parallel

    from scape.megatron.models import ModelShape, build_gpt_model

    m = spec.model
    shape = ModelShape(
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
    torch.manual_seed(spec.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
    _, model = build_gpt_model(shape, device=spec.scale.device)
    return model


def lr_at(step: int, scale: ScaleConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, cosine to ``min_lr`` at the last step."""
    if step < scale.warmup_steps:
        return scale.lr * (step + 1) / scale.warmup_steps
    span = max(1, scale.steps - scale.warmup_steps)
    progress = min(1.0, (step - scale.warmup_steps) / span)
    return scale.min_lr + 0.5 * (scale.lr - scale.min_lr) * (1.0 + math.cos(math.pi * progress))


def lm_loss(model: nn.Module, batch: Batch) -> Tensor:
    from scape.megatron.train import forward_loss

    tokens, labels = batch
    device = next(model.parameters()).device
    return forward_loss(model, tokens.to(device), labels.to(device))


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[Batch]) -> float:
    """Token-weighted mean loss over the validation batches."""
    model.eval()
    total, count = 0.0, 0
    for tokens, labels in batches:
        total += float(lm_loss(model, (tokens, labels))) * tokens.numel()
        count += tokens.numel()
    model.train()
    return total / count


def completed_run(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The final record of a finished run with these settings, else None."""
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
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


def train_run(
    spec: RunSpec,
    data: StudyData,
    val_batches: list[Batch],
    final_val_batches: list[Batch],
    out_dir: Path,
    code: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train one run, writing its JSONL; return the final record. ``code``: the
    :func:`~pipelines.studies.protocol.code_version` the header records.

    ``val_batches`` (a fixed subset, cheap) give the curve every ``eval_interval`` steps;
    ``final_val_batches`` (the whole validation split) give the final validation loss.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    final_path = out_dir / f"{spec.run_id}.jsonl"
    done = completed_run(final_path, spec.fingerprint())
    if done is not None:
        return done
    scale = spec.scale
    model = build_model(spec, data.vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    hparams = AdamHParams(**{**scale.shared(), "lr": scale.lr * spec.lr_scale})
    if spec.variant.method == "reading":
        from pipelines.studies.readings import ReadingConfig, build_reading_simulator

        reading = ReadingConfig(**spec.variant.run_options())
        sim = build_reading_simulator(model, scale.world_size, hparams, reading)
    else:
        sim = Simulator(
            model,
            scale.world_size,
            method=spec.variant.method,
            hparams=hparams,
            scape=scape_config(spec.variant),
        )
    tokens_per_step = scale.world_size * scale.batch_per_worker * scale.seq_length
    partial = out_dir / f"{spec.run_id}.jsonl.partial"
    start = time.perf_counter()
    skipped, diverged, last_val = 0, False, float("nan")
    rule = DivergenceRule(data.vocab_size)
    with open(partial, "w", encoding="utf-8") as log:

        def write(record: dict[str, Any]) -> None:
            log.write(json.dumps(record) + "\n")
            log.flush()

        write(
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
                "settings": {
                    "model": vars(spec.model),
                    "variant": vars(spec.variant),
                    "scale": {k: v for k, v in vars(scale).items() if k != "models"},
                },
            }
        )
        for step in range(scale.steps):
            lr = lr_at(step, scale) * spec.lr_scale
            result = sim.step(data.worker_batches(step), lm_loss, lr=lr)
            record: dict[str, Any] = {
                "step": result.step,
                "tokens": result.step * tokens_per_step,
                "loss": result.loss,
                "lr": lr,
                "grad_norm": result.grad_norm,
                "skipped": result.skipped,
                "bytes": sum(result.bytes.values()),
            }
            if result.mask_overlap is not None:
                record["mask_overlap"] = result.mask_overlap
            if result.moment_norm is not None:
                record["moment_norm"] = result.moment_norm
            skipped += int(result.skipped)
            diverged = rule.diverged(result.loss)
            last = diverged or result.step == scale.steps
            if last or result.step % scale.eval_interval == 0:
                last_val = evaluate(model, val_batches)
                record["val_loss"] = last_val
                diverged = diverged or not math.isfinite(last_val)
            if last or "val_loss" in record or result.step % LOG_EVERY == 0:
                write(record)
            if diverged:
                break  # nothing more to learn from a diverged run; it is counted as such
        final_val = evaluate(model, final_val_batches)
        final = {
            "event": FINAL,
            "steps": result.step,
            "final_val_loss": final_val if math.isfinite(final_val) else last_val,
            "diverged": diverged,
            "skipped_steps": skipped,
            "spike_steps": rule.spike_steps,
            # R3 (stale replicas): the oldest a replica entry got, and the largest relative
            # distance of a replica from the owners' values at the end
            **{k: getattr(sim, k) for k in STALENESS_KEYS if hasattr(sim, k)},
            "seconds": round(time.perf_counter() - start, 2),
        }
        write(final)
    os.replace(partial, final_path)  # the rename marks the run finished
    return final
