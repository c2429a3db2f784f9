"""Constants shared by the eval tests (a module, not conftest, so tests can import it)."""

from __future__ import annotations

from scape.megatron.models import ModelShape

# 500 tokenizer entries: Megatron pads the vocabulary to 512, exercising the padded logits
VOCAB = 500
SHAPE = ModelShape("eval-test-gpt", "gpt", 2, 64, 4, 256, VOCAB, 32)
