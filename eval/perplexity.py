"""Perplexity over a prepared split, in fixed windows of the model's context length.

The split's token stream (documents back to back, each closed by EOD, exactly what training
reads) is cut into consecutive windows of `seq_length + 1` tokens sharing one token at
each boundary, the way Megatron's GPT samples are built: window w feeds tokens
`[w*s, w*s + s)` and predicts `[w*s + 1, w*s + s + 1)`, so every token after the first is
predicted once, with between 0 and s-1 tokens of context. Unlike Megatron's validation the
windows are not shuffled or sampled with replacement, so the number is a deterministic
function of the model and the split. With `max_windows` an evenly spaced subset of the
windows is used (the same one every time).

The loss is the model's own (Megatron's cross entropy over the padded vocabulary), i.e. the
same quantity as the training and validation loss the pretrain stage logs; ppl = exp(loss).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from data_prep.dataset import PreparedData
from data_prep.progress import Progress
from eval.errors import EvalError
from eval.splits import SplitReader
from scape.megatron.train import causal_mask, position_ids

__all__ = ["PerplexityResult", "split_perplexity"]


@dataclass(frozen=True)
class PerplexityResult:
    split: str
    loss: float  # mean next-token cross entropy, nats per token
    ppl: float
    tokens: int  # tokens predicted
    windows: int
    seq_length: int

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def window_starts(stream_tokens: int, seq_length: int, max_windows: int | None) -> np.ndarray:
    """First token of each window used (evenly spaced when capped by `max_windows`)."""
    count = (stream_tokens - 1) // seq_length
    if max_windows is not None and 0 < max_windows < count:
        chosen = np.unique(np.linspace(0, count - 1, max_windows).round().astype(np.int64))
    else:
        chosen = np.arange(count, dtype=np.int64)
    return chosen * seq_length


@torch.no_grad()
def split_perplexity(
    model: torch.nn.Module,
    prepared: PreparedData,
    *,
    seq_length: int,
    split: str = "validation",
    batch_size: int = 8,
    max_windows: int | None = None,
    progress: bool = True,
) -> PerplexityResult:
    reader = SplitReader.open(prepared, split)
    starts = window_starts(len(reader.tokens), seq_length, max_windows)
    if len(starts) == 0:
        raise EvalError(
            f"the {split} split of {prepared.path} has {len(reader.tokens)} tokens, fewer than "
            f"one window of seq_length + 1 = {seq_length + 1}; prepare more data"
        )
    device = next(model.parameters()).device
    mask = causal_mask(seq_length, device)
    total, count = 0.0, 0
    with Progress(len(starts), f"{split} perplexity", unit="window", enabled=progress) as bar:
        for first in range(0, len(starts), batch_size):
            rows = [
                reader.tokens[s : s + seq_length + 1] for s in starts[first : first + batch_size]
            ]
            batch = torch.from_numpy(np.stack(rows).astype(np.int64)).to(device)
            b = batch.shape[0]
            losses = model(
                batch[:, :-1], position_ids(b, seq_length, device), mask, labels=batch[:, 1:]
            )
            total += float(losses.double().sum())
            count += losses.numel()
            bar.update(b, loss=total / count)
    loss = total / count
    return PerplexityResult(split, loss, math.exp(loss), count, len(starts), seq_length)
