"""The exported-model format: what pretrain writes and every evaluation reads.

An export directory holds two files:

* `model.pt`: the fp32 `state_dict` of the megatron-core `GPTModel` (tensors only; the
  local layer spec's `_extra_state` entries are always None and are left out). Saved with
  `torch.save`, read back with `torch.load(weights_only=True)`, so loading an export never
  runs pickled code.
* `model.json`: the model shape (the fields of `scape.megatron.models.ModelShape`), the
  prepared data directory the model was trained on, the tokenizer's identity (name, sha256,
  vocabulary size, EOD id), the training step, and the sha256 of `model.pt`.

Both files are written to a temporary name and renamed into place, weights first: a reader
never sees a half-written file, and a `model.json` always names the exact weights it goes
with (a crash between the two renames leaves a json whose sha256 no longer matches, which
`load_exported` reports instead of silently pairing a new model with old metadata).

The tokenizer is not copied: it is rebuilt from the prepared data (`PreparedData.
build_tokenizer`) and checked against the recorded sha256, so a model can never be scored
with a tokenizer other than the one it was trained with.

Pretrain's call, on rank 0 after any pending parameter all-gather has completed:
`export_model(model, cfg.model, prepared_dir, run_dir / "export", step=step)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from data_prep.dataset import load_prepared
from data_prep.errors import DataPrepError
from data_prep.tokenizers import TextTokenizer
from eval.errors import EvalError
from scape.megatron.models import ModelShape

__all__ = [
    "ExportMeta",
    "build_model",
    "export_dir",
    "export_model",
    "load_exported",
    "resolve_device",
]

EXPORT_FORMAT = "scape-export"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.pt"
META_FILE = "model.json"
EXPORT_SUBDIR = "export"  # <run_dir>/export is where pretrain puts the final model
SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


def export_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / EXPORT_SUBDIR


@dataclass(frozen=True)
class ExportMeta:
    """The contents of `model.json`, typed."""

    path: Path  # the export directory
    shape: ModelShape
    prepared_data_dir: Path
    tokenizer_name: str
    tokenizer_sha256: str
    vocab_size: int  # the tokenizer's; logits beyond it are Megatron's padding
    eod: int
    step: int | None
    weights_sha256: str
    raw: dict[str, Any]


def shape_of(model_cfg: Any) -> ModelShape:
    """A ModelShape from pipelines' ModelConfig, a ModelShape, or a plain mapping."""
    if isinstance(model_cfg, ModelShape):
        return model_cfg
    get = model_cfg.get if isinstance(model_cfg, Mapping) else lambda k: getattr(model_cfg, k)
    try:
        return ModelShape(**{k: get(k) for k in SHAPE_FIELDS})
    except (AttributeError, KeyError) as err:
        raise EvalError(f"model config lacks {err}; it needs {', '.join(SHAPE_FIELDS)}") from err


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare GPTModel inside Megatron's DDP and/or Float16Module (both keep it in `.module`)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def export_model(
    model: torch.nn.Module,
    model_cfg: Any,
    prepared_data_dir: str | Path,
    out_dir: str | Path,
    *,
    step: int | None = None,
) -> Path:
    """Write `out_dir/model.pt` and `out_dir/model.json`; return `out_dir`."""
    model = unwrap(model)
    shape = shape_of(model_cfg)
    prepared = _open_prepared(Path(prepared_data_dir).resolve())
    tok = prepared.metadata["tokenizer"]
    state = {
        name: value.detach().to("cpu", torch.float32).clone()
        for name, value in model.state_dict().items()
        if isinstance(value, torch.Tensor)
    }
    rows = state["embedding.word_embeddings.weight"].shape[0]
    if rows != shape.padded_vocab_size or tok["vocab_size"] > shape.vocab_size:
        raise EvalError(
            f"model has {rows} embedding rows, config vocab_size {shape.vocab_size} (padded "
            f"{shape.padded_vocab_size}), tokenizer {tok['vocab_size']}: they must agree"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / WEIGHTS_FILE
    _atomic_write(weights, lambda tmp: torch.save(state, tmp))
    meta = {
        "format": EXPORT_FORMAT,
        "format_version": FORMAT_VERSION,
        "shape": dataclasses.asdict(shape),
        "padded_vocab_size": shape.padded_vocab_size,
        "prepared_data_dir": str(prepared.path),
        "tokenizer": {k: tok[k] for k in ("name", "sha256", "vocab_size", "eod")},
        "step": step,
        "weights": {
            "file": WEIGHTS_FILE,
            "sha256": _sha256(weights),
            "dtype": "float32",
            "tensors": len(state),
            "parameters": sum(t.numel() for t in state.values()),
        },
        "created": {
            "utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__,
            "megatron-core": version("megatron-core"),
        },
    }
    text = json.dumps(meta, indent=2) + "\n"
    _atomic_write(out / META_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return out


def read_meta(out_dir: str | Path) -> ExportMeta:
    path = Path(out_dir)
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise EvalError(
            f"no exported model at {path} ({META_FILE} missing); pretrain writes one to "
            f"<run_dir>/{EXPORT_SUBDIR} (eval.export.export_model)"
        )
    try:
        raw = json.loads(meta_file.read_text(encoding="utf-8"))
        if raw.get("format") != EXPORT_FORMAT or raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"not {EXPORT_FORMAT} version {FORMAT_VERSION}")
        tok = raw["tokenizer"]
        return ExportMeta(
            path=path,
            shape=ModelShape(**raw["shape"]),
            prepared_data_dir=Path(raw["prepared_data_dir"]),
            tokenizer_name=tok["name"],
            tokenizer_sha256=tok["sha256"],
            vocab_size=int(tok["vocab_size"]),
            eod=int(tok["eod"]),
            step=raw.get("step"),
            weights_sha256=raw["weights"]["sha256"],
            raw=raw,
        )
    except (ValueError, KeyError, TypeError) as err:
        raise EvalError(
            f"{meta_file} is not a valid export ({err}); export the model again"
        ) from err


def load_exported(
    out_dir: str | Path,
    device: str = "cpu",
    *,
    prepared_data_dir: str | Path | None = None,
    verify_weights: bool = True,
) -> tuple[torch.nn.Module, TextTokenizer, ExportMeta]:
    """Rebuild the GPTModel of an export, in eval mode on `device`, with its tokenizer.

    `prepared_data_dir` overrides the recorded location (data moved to another machine);
    the tokenizer found there must still hash to the recorded sha256.
    """
    meta = read_meta(out_dir)
    prepared = _open_prepared(Path(prepared_data_dir or meta.prepared_data_dir))
    try:
        tokenizer = prepared.build_tokenizer()
    except DataPrepError as err:
        raise EvalError(str(err)) from err
    if tokenizer.sha256 != meta.tokenizer_sha256:
        raise EvalError(
            f"tokenizer at {prepared.path} (sha256 {tokenizer.sha256[:12]}...) is not the one "
            f"{meta.path} was trained with ({meta.tokenizer_sha256[:12]}...); point "
            "prepared_data_dir at the data the model was trained on"
        )
    weights = meta.path / WEIGHTS_FILE
    if not weights.is_file():
        raise EvalError(f"{weights} is missing; export the model again")
    if verify_weights and _sha256(weights) != meta.weights_sha256:
        raise EvalError(
            f"{weights} does not match the sha256 in {META_FILE} (export interrupted or "
            "overwritten?); export the model again"
        )
    model = build_model(meta.shape)
    state = torch.load(weights, map_location="cpu", weights_only=True)
    _check_state(model, state, weights)
    model.load_state_dict(state, strict=False)  # only the always-None _extra_state is absent
    return model.to(resolve_device(device)).eval(), tokenizer, meta


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise EvalError(f"device={device!r} but this machine has no CUDA device; use device=cpu")
    return resolved


def build_model(shape: ModelShape) -> torch.nn.Module:
    """A GPTModel in this process, setting up the 1-rank Megatron state it needs if absent."""
    import logging

    import torch.distributed as dist

    # megatron's import announces Megatron-FSDP at INFO, which says nothing about this model
    logging.getLogger("megatron.core.distributed.fsdp").setLevel(logging.WARNING)
    from scape.megatron.dense import init_megatron
    from scape.megatron.models import build_gpt_model

    if not dist.is_initialized():
        # an in-memory store: a 1-rank group needs no rendezvous, so no port can clash
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    # init_megatron and the random initialization reseed torch; the caller's RNG stays as it was
    with torch.random.fork_rng(devices=[]):
        init_megatron()
        _, model = build_gpt_model(shape, device="cpu")
    return model


def _check_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = {k: v.shape for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    wrong = [k for k in expected.keys() & state.keys() if state[k].shape != expected[k]]
    if missing or unexpected or wrong:
        details = [
            f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape", wrong))
            if keys
        ]
        raise EvalError(
            f"{source} does not fit the shape in {META_FILE} ({'; '.join(details)}); "
            "export the model again"
        )


def _open_prepared(path: Path):
    try:
        # the tokenizer hash is what ties a model to its data; rehashing multi-GB splits is not
        return load_prepared(path, verify_hashes=False)
    except DataPrepError as err:
        raise EvalError(f"{err} (the model's prepared data; pass prepared_data_dir=...)") from err


def _atomic_write(target: Path, write) -> None:
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
