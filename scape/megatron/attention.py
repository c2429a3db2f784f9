"""Megatron-Core's local attention with its core through torch's fused SDPA.

The local layer spec (no Transformer Engine) computes attention as baddbmm, softmax and bmm,
materializing the (b, heads, s, s) scores: at s=2048 that is most of a step's memory traffic.
:class:`SDPAttention` is the same module with the core as one
``torch.nn.functional.scaled_dot_product_attention`` call (flash attention on a GPU), causal
and grouped-query as the spec's. :func:`scape.megatron.models.build_gpt_model` uses it on
CUDA, where it is the best dense step this stack can run without Transformer Engine.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor

__all__ = ["SDPAttention"]


class SDPAttention(DotProductAttention):
    """``DotProductAttention`` whose causal core is one fused SDPA call; any other mask
    type, dropout or bias goes to the parent's unfused path."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params=None,
    ) -> Tensor:
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if (
            mask_type != AttnMaskType.causal
            or attention_bias is not None
            or packed_seq_params is not None
            or (self.training and self.config.attention_dropout > 0)
        ):
            return super().forward(query, key, value, attention_mask, attn_mask_type,
                                   attention_bias, packed_seq_params)  # fmt: skip
        # [s, b, heads, hn] -> [b, heads, s, hn]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        context = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=k.size(1) != q.size(1)
        )
        # [b, heads, s, hn] -> [s, b, heads * hn]
        s, b = query.size(0), query.size(1)
        return context.permute(2, 0, 1, 3).reshape(s, b, -1)
