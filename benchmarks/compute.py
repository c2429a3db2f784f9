"""The model shape and data of the byte-count runs (:mod:`benchmarks.bytes`): a small Llama
(built as a Megatron ``GPTModel`` by :mod:`benchmarks.megatron_workload`) on byte-level text,
so that no prepared corpus or tokenizer is needed.

Data: the first bytes of the English Wikipedia sample shipped inside the pinned ``gensim``
package (markup included), as tokens 0..255; a seeded synthetic stream if it is missing.
Each (rank, step) reads its own deterministic window, so every method sees the same data.
"""

from __future__ import annotations

import bz2
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["LlamaShape", "batch_for", "corpus_bytes"]

_WIKI = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


@dataclass(frozen=True)
class LlamaShape:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    ffn: int = 704
    vocab: int = 256
    seq: int = 64
    batch: int = 1  # sequences per rank per step

    def num_params(self) -> int:
        h, f = self.hidden, self.ffn
        per_layer = 4 * h * h + 3 * h * f + 2 * h
        return self.layers * per_layer + 2 * self.vocab * h + h


@lru_cache(maxsize=1)
def corpus_bytes(limit: int = 2_000_000) -> Tensor:
    """Up to ``limit`` bytes of the gensim Wikipedia sample as int64 tokens (or synthetic)."""
    spec = importlib.util.find_spec("gensim")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / _WIKI
        if path.exists():
            with bz2.open(path) as fh:
                raw = fh.read(limit)
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
    # Fallback: a seeded order-1 Markov stream, so gradients still have structure.
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3.0 * torch.randn(256, 256, generator=g), dim=1)
    out = torch.empty(limit // 8, dtype=torch.int64)
    out[0] = 0
    draws = torch.rand(out.numel(), generator=g)
    cdf = probs.cumsum(1)
    for i in range(1, out.numel()):
        out[i] = min(255, int(torch.searchsorted(cdf[out[i - 1]], draws[i])))
    return out


def batch_for(shape: LlamaShape, *, rank: int, step: int, world_size: int) -> Tensor:
    """(batch, seq + 1) tokens for this rank and step; a deterministic sweep of the corpus."""
    data = corpus_bytes()
    span = shape.seq + 1
    windows = data.numel() // span
    rows = []
    for b in range(shape.batch):
        i = ((step * world_size + rank) * shape.batch + b) * 7919 % windows
        rows.append(data[i * span : (i + 1) * span])
    return torch.stack(rows)
