"""Export -> load round trip, and the checks that refuse a mismatched export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from eval_test_helpers import SHAPE

from eval.errors import EvalError
from eval.export import META_FILE, WEIGHTS_FILE, build_model, export_model, load_exported
from scape.megatron.train import causal_mask, position_ids


def _logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    b, s = tokens.shape
    with torch.no_grad():
        return model(tokens, position_ids(b, s, "cpu"), causal_mask(s, "cpu"))


class _Wrapper(torch.nn.Module):
    """Stands in for Megatron's DDP / Float16Module, which hold the model in `.module`."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def test_round_trip_gives_identical_logits(prepared, tmp_path):
    model = build_model(SHAPE)
    with torch.no_grad():  # not the seeded init, so the test would catch a rebuilt-not-loaded model
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    out = export_model(
        _Wrapper(_Wrapper(model)), vars(SHAPE), prepared.path, tmp_path / "x", step=3
    )
    assert sorted(p.name for p in out.iterdir()) == [META_FILE, WEIGHTS_FILE]  # no temp files

    loaded, tokenizer, meta = load_exported(out)
    tokens = torch.randint(0, SHAPE.vocab_size, (2, SHAPE.seq_length))
    assert torch.equal(_logits(model.eval(), tokens), _logits(loaded, tokens))
    assert _logits(loaded, tokens).shape == (2, SHAPE.seq_length, SHAPE.padded_vocab_size)
    assert meta.shape == SHAPE and meta.step == 3 and meta.vocab_size == tokenizer.vocab_size
    assert meta.prepared_data_dir == prepared.path.resolve()
    assert tokenizer.sha256 == prepared.metadata["tokenizer"]["sha256"]
    state = torch.load(out / WEIGHTS_FILE, weights_only=True)
    assert all(t.dtype == torch.float32 for t in state.values())


def _copy(export: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    return copy


def _edit_meta(path: Path, edit) -> None:
    meta = json.loads((path / META_FILE).read_text())
    edit(meta)
    (path / META_FILE).write_text(json.dumps(meta))


def test_refuses_another_tokenizer(export, tmp_path):
    copy = _copy(export, tmp_path)
    _edit_meta(copy, lambda m: m["tokenizer"].update(sha256="0" * 64))
    with pytest.raises(EvalError, match="is not the one .* was trained with"):
        load_exported(copy)


def test_refuses_changed_weights(export, tmp_path):
    copy = _copy(export, tmp_path)
    with open(copy / WEIGHTS_FILE, "ab") as stream:
        stream.write(b"\0")
    with pytest.raises(EvalError, match="does not match the sha256"):
        load_exported(copy)


def test_refuses_weights_of_another_shape(export, tmp_path):
    copy = _copy(export, tmp_path)
    _edit_meta(copy, lambda m: m["shape"].update(num_layers=3))
    with pytest.raises(EvalError, match=r"does not fit the shape .*missing: decoder\.layers\.2"):
        load_exported(copy)


def test_missing_export_names_the_fix(tmp_path):
    with pytest.raises(EvalError, match="no exported model at .*export_model"):
        load_exported(tmp_path)
