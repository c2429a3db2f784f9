"""The one record format and the one evaluation (pipelines.training.metrics)."""

import pytest
import torch
from torch import nn

from pipelines.training.metrics import sent_by_kind, sent_total, step_record, validation_loss
from scape.megatron.train import StepResult


class PerTokenLoss(nn.Module):
    """Megatron's GPTModel call (tokens, position ids, mask, labels) -> per-token loss [b, s]."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.37))

    def forward(self, tokens, position_ids, attention_mask, labels):
        del position_ids, attention_mask
        return torch.sin(tokens.float() * self.scale) + labels.float() / 7


def _batches(sizes, seq=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 50, (b, seq), generator=g), torch.randint(0, 50, (b, seq), generator=g))
            for b in sizes]  # fmt: skip


def test_validation_loss_weights_each_batch_by_its_tokens_and_leaves_train_mode():
    model = PerTokenLoss()
    batches = _batches([2, 1, 3])
    means = [float(model(t, None, None, labels=y).mean()) for t, y in batches]
    want = (means[0] * 32 + means[1] * 16 + means[2] * 48) / 96
    assert validation_loss(model, batches) == pytest.approx(want, rel=1e-12)
    assert validation_loss(model, batches) != pytest.approx(sum(means) / 3, rel=1e-6)
    assert model.training


def test_equal_power_of_two_batches_give_the_plain_mean_bit_for_bit():
    """Why the pretrain stage's evaluation could become the studies' without moving its
    figures: its batches are micro_batch_size x seq_length tokens, powers of two."""
    model = PerTokenLoss()
    batches = _batches([2] * 5, seq=64, seed=3)
    means = [float(model(t, None, None, labels=y).mean()) for t, y in batches]
    assert validation_loss(model, batches) == sum(means) / len(means)


def test_a_step_record_has_the_shared_fields_in_order_and_bytes_summed():
    result = StepResult(loss=2.5, grad_norm=0.75, updated=False, seconds=0.1)
    record = step_record(3, 1024, 2.5, 1e-3, result, {"grad_values": 100.0, "masks": 20.0})
    assert list(record) == ["step", "tokens", "loss", "lr", "grad_norm", "skipped", "bytes"]
    assert (record["tokens"], record["skipped"], record["bytes"]) == (3072, True, 120.0)


def test_sent_bytes_read_every_record_form():
    by_kind = {"grad_values": 100.0, "masks": 20.0}
    now = {"step": 1, "bytes": 120.0, "bytes_by_kind": by_kind}  # the pretrain stage's
    before = {"step": 1, "bytes": by_kind}  # the pretrain stage's before 2026-12-06
    study = {"step": 1, "bytes": 120.0}  # a study's: the total only
    assert sent_by_kind(now) == sent_by_kind(before) == by_kind
    assert sent_by_kind(study) == {"total": 120.0} and sent_by_kind({"step": 1}) == {}
    assert sent_total(now) == sent_total(before) == sent_total(study) == 120.0
