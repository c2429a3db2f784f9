"""Model shapes: the closed-form parameter counts match the names of the paper's models.

(That megatron builds exactly these counts is checked in ``test_dense.py``'s spawned ranks,
which import megatron anyway.)
"""

import pytest

from scape.megatron.models import SHAPES, ModelShape, count_params


@pytest.mark.parametrize(
    "name, low, high",
    [
        ("gpt-345m", 340e6, 360e6),  # Megatron's "345M" (355M with the padded 50304 vocab)
        ("llama-500m", 480e6, 520e6),
        ("llama-1.8b", 1.7e9, 1.85e9),
        ("tiny-gpt", 5e4, 1e6),
        ("tiny-llama", 5e4, 1e6),
    ],
)
def test_param_counts_match_the_names(name, low, high):
    assert low <= count_params(SHAPES[name]) <= high


def test_vocab_is_padded_to_a_multiple_of_128():
    assert SHAPES["gpt-345m"].padded_vocab_size == 50304
    assert SHAPES["llama-1.8b"].padded_vocab_size == 32000


def test_llama_shapes_use_grouped_query_attention_where_assumed():
    assert SHAPES["tiny-llama"].num_query_groups == 2
    assert SHAPES["llama-500m"].num_query_groups == 4


def test_invalid_shapes_are_refused():
    with pytest.raises(ValueError, match="divisible"):
        ModelShape("bad", "llama", 2, 64, 5, 128, 256, 32)
    with pytest.raises(ValueError, match="family"):
        ModelShape("bad", "bert", 2, 64, 4, 128, 256, 32)
