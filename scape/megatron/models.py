"""megatron-core ``GPTModel`` builders: GPT-2-style and Llama-style, tiny to 1.8B.

Both families use megatron-core's *local* layer spec (no Transformer Engine), so the same
model runs on a CPU (tests, with :mod:`scape.megatron.cpu_compat`) and on a GPU.

* GPT-2 style: LayerNorm, GeLU MLP, biases, learned absolute positions, tied input/output
  embeddings (as GPT-2 and Megatron-LM's GPT-345M example).
* Llama style: RMSNorm, SwiGLU MLP, RoPE, no biases, grouped-query attention, untied
  embeddings.

The big shapes are the reference doc's assumptions. The number of key/value heads of the Llama
shapes is not given there; it is **assumed** here and chosen so that the totals match the
names: Llama-500M with 4 KV groups (495M params), Llama-1.8B with 16 (i.e. MHA, 1.78B).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["ATTENTIONS", "ModelShape", "SHAPES", "build_gpt_model", "count_params",
           "transformer_config"]  # fmt: skip

Family = Literal["gpt", "llama"]


@dataclass(frozen=True)
class ModelShape:
    """Everything that fixes a model's parameter tensors (and its context length)."""

    name: str
    family: Family
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    num_query_groups: int | None = None  # None: one KV head per query head (MHA)

    def __post_init__(self) -> None:
        if self.family not in ("gpt", "llama"):
            raise ValueError(f"family must be 'gpt' or 'llama', got {self.family!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{self.name}: hidden_size must be divisible by the head count")
        groups = self.num_query_groups or self.num_attention_heads
        if self.num_attention_heads % groups:
            raise ValueError(f"{self.name}: num_attention_heads must be divisible by KV groups")

    @property
    def padded_vocab_size(self) -> int:
        """Megatron pads the vocabulary to a multiple of 128 (times TP size, here 1)."""
        return int(math.ceil(self.vocab_size / 128) * 128)

    def replace(self, **changes) -> ModelShape:
        return dataclasses.replace(self, **changes)


SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in [
        # Test sizes: ~100k params, a few ms per step on one CPU core.
        ModelShape("tiny-gpt", "gpt", 2, 64, 4, 256, 256, 32),
        ModelShape("tiny-llama", "llama", 2, 64, 4, 176, 256, 32, num_query_groups=2),
        # CPU benchmarks: ~5M params, compute large enough to compare with communication.
        ModelShape("small-gpt", "gpt", 4, 256, 4, 1024, 8192, 128),
        ModelShape("small-llama", "llama", 4, 256, 4, 688, 8192, 128, num_query_groups=2),
        # The paper's sizes (reference doc, "Assumed model shapes").
        ModelShape("gpt-345m", "gpt", 24, 1024, 16, 4096, 50257, 1024),
        ModelShape("llama-500m", "llama", 24, 1280, 20, 3456, 32000, 2048, num_query_groups=4),
        ModelShape("llama-1.8b", "llama", 32, 2048, 16, 5632, 32000, 2048, num_query_groups=16),
    ]
}


def count_params(shape: ModelShape) -> int:
    """Parameter count of :func:`build_gpt_model`'s model, by formula (tested against it)."""
    h, f, L = shape.hidden_size, shape.ffn_hidden_size, shape.num_layers
    kv = (shape.num_query_groups or shape.num_attention_heads) * (h // shape.num_attention_heads)
    v = shape.padded_vocab_size
    if shape.family == "gpt":
        attn = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h  # qkv + bias, proj + bias
        mlp = h * f + f + f * h + h
        norms = 2 * 2 * h  # two LayerNorms (weight, bias) per layer
        per_layer = attn + mlp + norms
        embed = v * h + shape.seq_length * h  # tied output layer adds nothing
        return L * per_layer + embed + 2 * h  # + final LayerNorm
    attn = h * (h + 2 * kv) + h * h
    mlp = h * 2 * f + f * h  # gate and up fused in fc1
    per_layer = attn + mlp + 2 * h  # two RMSNorm weights
    return L * per_layer + 2 * v * h + h  # untied embedding and output, final RMSNorm


def transformer_config(shape: ModelShape, *, bf16: bool = False, **overrides):
    """The megatron ``TransformerConfig`` for ``shape`` (dropout 0, as in nanoGPT pre-training)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    common = dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        ffn_hidden_size=shape.ffn_hidden_size,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        # Params are created on the CPU and moved afterwards: works with and without a GPU,
        # and makes initialization independent of the device.
        use_cpu_initialization=True,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
    )
    if shape.family == "gpt":
        family = dict(normalization="LayerNorm", add_bias_linear=True, activation_func=F.gelu)
    else:
        family = dict(
            normalization="RMSNorm",
            add_bias_linear=False,
            gated_linear_unit=True,
            activation_func=F.silu,
            layernorm_epsilon=1e-5,
        )
    return TransformerConfig(**{**common, **family, **overrides})


ATTENTIONS = ("local", "sdpa")


def build_gpt_model(
    shape: ModelShape,
    *,
    device: str | torch.device = "cpu",
    bf16: bool = False,
    attention: str | None = None,
    **overrides,
):
    """Return ``(TransformerConfig, GPTModel)`` for ``shape`` on ``device``.

    Megatron's model-parallel state must be initialized (see :func:`scape.megatron.dense.
    init_megatron`). ``bf16`` gives bf16 params (GPU runs; the optimizer keeps fp32 main
    params). ``attention``: ``local`` (the spec's unfused core) or ``sdpa`` (torch's fused
    attention, :mod:`scape.megatron.attention`); None: ``sdpa`` on CUDA, ``local`` elsewhere.
    The model's forward takes ``(tokens, position_ids, attention_mask, labels=...)`` and
    returns the per-token loss ``[batch, seq]`` when labels are given.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    if attention is None:
        attention = "sdpa" if torch.device(device).type == "cuda" else "local"
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r} is not one of {ATTENTIONS}")
    config = transformer_config(shape, bf16=bf16, **overrides)
    llama = shape.family == "llama"
    spec = get_gpt_layer_local_spec(normalization="RMSNorm" if llama else "LayerNorm")
    if attention == "sdpa":
        from scape.megatron.attention import SDPAttention

        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=shape.padded_vocab_size,
        max_sequence_length=shape.seq_length,
        share_embeddings_and_output_weights=not llama,
        position_embedding_type="rope" if llama else "learned_absolute",
    )
    if bf16:
        # As Megatron-LM does for bf16: the wrapper casts the bf16 module's float outputs.
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)
    return config, model.to(device)
