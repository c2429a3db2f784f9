"""The peers' byte formulas: the model's tensors, the benchmarks' dense and SCAPE formulas, and
the bytes real runs counted (the committed r6 sweep: 9 methods, 200 steps, 2 ranks)."""

import json
import math
from pathlib import Path

import pytest

from pipelines.studies.peers_bytes import ddp_buckets, method_bytes, param_shapes
from pipelines.training.config import compose
from scape.megatron.models import SHAPES, ModelShape, count_params

REPO = Path(__file__).resolve().parents[3]
R6 = REPO / "results" / "peers" / "r6" / "peers.json"


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_param_shapes_add_up_to_the_model(name):
    shape = SHAPES[name]
    assert sum(math.prod(s) for s in param_shapes(shape)) == count_params(shape)


@pytest.mark.parametrize("model", ["gpt-345m", "llama-1.8b"])
def test_dense_and_scape_match_the_benchmarks_formulas(model):
    from benchmarks.harness import paper

    shape, n = SHAPES[model], count_params(SHAPES[model])
    for method, expected in (
        ("adams", sum(paper.dense_bytes(n, 32, value_nbytes=4).values())),
        ("scape90", sum(paper.scape_bytes(n, 32, 0.9, 2).values())),  # the configs' bf16 wire
        ("scape99", sum(paper.scape_bytes(n, 32, 0.99, 2).values())),
    ):
        o = compose([f"optimizer={method}"]).optimizer
        assert method_bytes(o, shape, 32) == pytest.approx(expected, rel=1e-12)


def test_ddp_buckets_close_at_torchs_caps():
    mib = 1024 * 1024 // 4  # fp32 elements in 1 MiB
    assert ddp_buckets([10, 20]) == [30]
    # reverse order: the last parameter opens the 1 MiB bucket, the next ones fill 25 MiB
    assert ddp_buckets([5, 24 * mib, 2 * mib, mib]) == [mib, 26 * mib, 5]


def test_formulas_reproduce_the_bytes_the_r6_runs_counted():
    """Run means of the committed sweep (4,096-entry tiny GPT, 2 ranks, 200 steps) from each
    steady-state formula and the method's warm-up phase, whose steps send what dense does:
    SCAPE 1 dense step (its reduce-scatter and all-gather), PowerSGD 2 plain all-reduces
    (start_iter), 1-bit Adam 20 (freeze_step = the lr warm-up). Megatron pads each
    parameter's start (64 entries), which the dense formula leaves out: 1 part in 10^4."""
    measured = {r["method"]: r["bytes_per_step"] for r in json.loads(R6.read_text())["results"]}
    steps = 200
    for method, mean in measured.items():
        cfg = compose(["experiment=peers_gpt345m_owt", "scale=tiny", f"optimizer={method}",
                       "optimizer.dgc.warmup_steps=0",  # the r6 runs had no DGC warm-up
                       *(["optimizer.scape.value_dtype=float32"] if "scape" in method else [])])  # fmt: skip
        m = cfg.model
        shape = ModelShape(m.name, m.family, m.num_layers, m.hidden_size, m.num_attention_heads,
                           m.ffn_hidden_size, m.vocab_size, m.seq_length)  # fmt: skip
        steady, dense = method_bytes(cfg.optimizer, shape, 2), 4.0 * count_params(shape)
        warm = {"scape": 1, "powersgd": 2, "onebit": 20}.get(cfg.optimizer.name, 0)
        expected = (warm * dense + (steps - warm) * steady) / steps
        exact = cfg.optimizer.name in ("dgc", "powersgd", "onebit")
        assert expected == pytest.approx(mean, rel=1e-12 if exact else 1e-3), method
