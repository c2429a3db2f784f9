"""The compute half of a benchmark step: a small Llama trained on byte-level text.

Why a model of our own here: the emulated cluster needs a real forward/backward whose
gradients have real structure (mask overlap between steps depends on it) and whose cost
is small and steady on a shared 2-core machine. This is a plain-PyTorch Llama (RMSNorm,
SwiGLU, RoPE, causal attention, untied embeddings); the Megatron ``GPTModel`` of
``scape.megatron.models`` is the one the real training uses, and the workload seam
(:mod:`benchmarks.workloads`) takes either.

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
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LlamaShape", "TinyLlama", "batch_for", "corpus_bytes", "flops_per_step"]

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


class _Block(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.heads = s.heads
        self.norm1, self.norm2 = nn.RMSNorm(s.hidden, eps=1e-5), nn.RMSNorm(s.hidden, eps=1e-5)
        self.qkv = nn.Linear(s.hidden, 3 * s.hidden, bias=False)
        self.proj = nn.Linear(s.hidden, s.hidden, bias=False)
        self.fc1 = nn.Linear(s.hidden, 2 * s.ffn, bias=False)  # gate and up, fused
        self.fc2 = nn.Linear(s.ffn, s.hidden, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).unbind(2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, h))
        gate, up = self.fc1(self.norm2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TinyLlama(nn.Module):
    def __init__(self, shape: LlamaShape, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.blocks = nn.ModuleList(_Block(shape) for _ in range(shape.layers))
        self.norm = nn.RMSNorm(shape.hidden, eps=1e-5)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        for p in self.parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)
        head_dim = shape.hidden // shape.heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(shape.seq).float(), inv)  # (seq, head_dim/2)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, tokens: Tensor) -> Tensor:
        """Mean next-token cross-entropy of ``tokens`` (batch, seq + 1)."""
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


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


def flops_per_step(shape: LlamaShape) -> float:
    """6 * params * tokens (forward + backward), the usual estimate."""
    return 6.0 * shape.num_params() * shape.batch * shape.seq
