"""Token-level scoring with a megatron-core GPTModel: log-probabilities and greedy decoding.

Plain functions of token ids, so the lm-eval adapter (`eval.lm`) only maps requests to
them and the tests can check them against hand computations from raw logits.

The model's embedding is Megatron's padded vocabulary (a multiple of 128); ids at or above
the tokenizer's `vocab_size` never occur in the data. Every distribution here is the
softmax over the real vocabulary only, so the padding can neither take probability mass
nor be emitted by greedy decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from scape.megatron.train import causal_mask, position_ids

__all__ = ["greedy_generate", "log_probs", "score_continuations"]


@torch.no_grad()
def log_probs(model: torch.nn.Module, tokens: Tensor, vocab_size: int) -> Tensor:
    """Next-token log-probabilities `[b, s, vocab_size]` (float32) for `tokens` `[b, s]`.

    megatron-core 0.16.1's GPTModel returns logits as `[b, s, padded_vocab]` without labels
    (its `_postprocess` transposes its internal `[s, b, v]`).
    """
    b, s = tokens.shape
    logits = model(tokens, position_ids(b, s, tokens.device), causal_mask(s, tokens.device))
    return torch.log_softmax(logits[..., :vocab_size].float(), dim=-1)


def score_continuations(
    model: torch.nn.Module,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    vocab_size: int,
    max_length: int,
    pad_id: int,
    device: torch.device,
) -> list[tuple[float, bool]]:
    """`(sum of log p(continuation | context), is_greedy)` for each `(context, continuation)`.

    One forward pass for the whole batch. Each row is the last `max_length + 1` tokens of
    context + continuation minus the final token (the model's context window, truncated on
    the left as lm-eval's own backends do), right-padded: with a causal mask the padding
    after a row's end cannot change its earlier positions. `is_greedy` says whether argmax
    decoding reproduces the continuation token for token.
    """
    rows, spans = [], []
    for context, continuation in pairs:
        if not context or not continuation:
            raise ValueError("context and continuation must be non-empty (lm-eval adds a prefix)")
        if len(continuation) > max_length:
            raise ValueError(
                f"continuation of {len(continuation)} tokens exceeds the model's context "
                f"({max_length}); use loglikelihood_rolling for long texts"
            )
        whole = (list(context) + list(continuation))[-(max_length + 1) :]
        rows.append(whole[:-1])
        spans.append(len(continuation))
    width = max(len(r) for r in rows)
    batch = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    logp = log_probs(model, batch.to(device), vocab_size)
    results = []
    for i, (row, n) in enumerate(zip(rows, spans, strict=True)):
        # positions len(row)-n .. len(row)-1 predict the n continuation tokens
        picked = logp[i, len(row) - n : len(row)].cpu()
        targets = torch.tensor(list(pairs[i][1]), dtype=torch.long)
        total = float(picked.gather(1, targets[:, None]).sum())
        greedy = bool((picked.argmax(dim=-1) == targets).all())
        results.append((total, greedy))
    return results


def greedy_generate(
    model: torch.nn.Module,
    context: Sequence[int],
    *,
    vocab_size: int,
    max_length: int,
    max_new_tokens: int,
    eod: int,
    device: torch.device,
    detokenize: Callable[[list[int]], str],
    stop: Sequence[str] = (),
) -> str:
    """Greedy continuation of `context`, cut before the first stop string or the EOD token.

    No KV cache: every step runs the model over the last `max_length` tokens, so a
    generation longer than the context window keeps sliding instead of failing. The text is
    decoded from the generated ids at each step, so a stop string split across tokens is
    still found.
    """
    tokens = list(context) or [eod]  # an empty prompt conditions on the document separator
    generated: list[int] = []
    text = ""
    for _ in range(max_new_tokens):
        window = torch.tensor([tokens[-max_length:]], dtype=torch.long, device=device)
        next_id = int(log_probs(model, window, vocab_size)[0, -1].argmax())
        if next_id == eod:
            break
        tokens.append(next_id)
        generated.append(next_id)
        text = detokenize(generated)
        cut = _first_stop(text, stop)
        if cut is not None:
            return text[:cut]
    return text


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None
