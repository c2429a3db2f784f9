"""Bytes one rank sends per step, by formula, for every method of the peers study at any model
shape and rank count: how the peers frontier projects its measured methods to the paper's
shapes (GPT-345M and Llama-1.8B at 32 ranks).

Each formula is the accounting its method's code already does, written for a shape instead of
counted on the wire (ring accounting, :func:`scape.comm.ring_bytes_per_rank`):

- dense AdamS / AdamW, Megatron's ZeRO-1: a reduce-scatter of the gradient and an all-gather
  of the parameters over Megatron's buckets (``benchmarks.harness.paper.dense_bytes``);
- SCAPE: :func:`scape.comm.step_bytes_per_rank` of each bucket's shards' selected coefficients
  (:func:`scape.basis.selected_count`; ``benchmarks.harness.paper.scape_bytes``), masks included;
- DGC: per DDP bucket, the all-gather of ``k = num_selected(n, density)`` int32 indices and
  values from every rank (:class:`scape.peers.dgc.DGCHook`);
- PowerSGD: per parameter, torch's own rule (a matrix ``n x m`` with ``n = shape[0]`` is sent as
  P and Q of ``(n + m) r`` entries when that is ``min_compression_rate`` times smaller, else
  whole), each all-reduced (:mod:`scape.peers.powersgd`);
- 1-bit Adam after its freeze: per DDP bucket, the two phases of
  :func:`scape.peers.onebit.compressed_allreduce` (packed signs and one fp32 scale per rank).

These are steady-state figures (after SCAPE's dense step, PowerSGD's plain first steps, DGC's
warm-up schedule and 1-bit Adam's dense warm-up); a run's measured mean includes those phases.
The tests check every formula against the bytes a real run counted at the run's own shape,
and the dense and SCAPE formulas against the benchmarks' (``tests/pipelines/studies``).
"""

from __future__ import annotations

import math

from pipelines.training.config import OptimizerConfig, scape_config
from scape.basis import selected_count
from scape.comm import ring_bytes_per_rank, step_bytes_per_rank
from scape.megatron.models import ModelShape
from scape.peers.dgc import num_selected
from scape.peers.onebit import padded_numel
from scape.shard import WIRE_DTYPES

__all__ = [
    "ddp_buckets",
    "megatron_buckets",
    "method_bytes",
    "param_shapes",
]

FP32 = 4
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # torch DDP's bucket_cap_mb default


def param_shapes(shape: ModelShape) -> list[tuple[int, ...]]:
    """The parameter tensors of :func:`scape.megatron.models.build_gpt_model`'s model, in
    registration order (their numels sum to :func:`~scape.megatron.models.count_params`)."""
    h, f, v = shape.hidden_size, shape.ffn_hidden_size, shape.padded_vocab_size
    kv = (shape.num_query_groups or shape.num_attention_heads) * (h // shape.num_attention_heads)
    if shape.family == "gpt":
        layer = [(h,), (h,), (h + 2 * kv, h), (h + 2 * kv,), (h, h), (h,),
                 (h,), (h,), (f, h), (f,), (h, f), (h,)]  # fmt: skip
        return [(v, h), (shape.seq_length, h), *layer * shape.num_layers, (h,), (h,)]
    layer = [(h,), (h + 2 * kv, h), (h, h), (h,), (2 * f, h), (h, f)]
    return [(v, h), *layer * shape.num_layers, (h,), (v, h)]


def megatron_buckets(n_params: int, world_size: int) -> list[int]:
    """Megatron's DDP buckets: max(40M, 1M * W) elements, each padded to lcm(W, 128)."""
    bucket = max(40_000_000, 1_000_000 * world_size)
    pad = math.lcm(world_size, 128)
    sizes = [bucket] * (n_params // bucket) + ([n_params % bucket] if n_params % bucket else [])
    return [math.ceil(s / pad) * pad for s in sizes]


def ddp_buckets(numels: list[int], element_size: int = FP32) -> list[int]:
    """torch DDP's buckets (elements) over parameters of ``numels``: filled in reverse order (the
    order gradients become ready), the first closed at 1 MiB, the others at 25 MiB."""
    buckets, current, cap = [], 0, DDP_FIRST_BUCKET_BYTES
    for n in reversed(numels):
        current += n
        if current * element_size >= cap:
            buckets.append(current)
            current, cap = 0, DDP_BUCKET_BYTES
    return buckets + ([current] if current else [])


def method_bytes(o: OptimizerConfig, shape: ModelShape, world_size: int) -> float:
    """Bytes one rank sends in a steady-state step of method ``o`` (the run's optimizer config:
    name, sparsity, rank, wire dtype) on a model of ``shape`` over ``world_size`` ranks, every
    value fp32 as the peers study runs them (the scalars of 1-bit Adam included)."""
    W, shapes = world_size, param_shapes(shape)
    numels = [math.prod(s) for s in shapes]
    if o.name in ("adams", "adamw"):
        return 2 * ring_bytes_per_rank(sum(megatron_buckets(sum(numels), W)) * FP32, W)
    if o.name == "scape":
        sc = scape_config(o)
        shards = [b // W for b in megatron_buckets(sum(numels), W)]
        selected = [selected_count(s, sc.chunk, sc.k) for s in shards]
        nbytes = WIRE_DTYPES[sc.value_dtype].itemsize
        return sum(step_bytes_per_rank(selected, W, nbytes, masks=True).values())
    if o.name == "dgc":
        value = WIRE_DTYPES[o.dgc.value_dtype].itemsize
        density = 1.0 - o.dgc.sparsity
        ks = [num_selected(n, density) for n in ddp_buckets(numels)]
        return sum(ring_bytes_per_rank(W * k * (4 + value), W) for k in ks)
    if o.name == "powersgd":
        p, sent = o.powersgd, 0
        for s in shapes:
            n = s[0]
            m = math.prod(s) // n
            r = min(n, m, p.rank)
            sent += (n + m) * r if (n + m) * r * p.min_compression_rate < n * m else n * m
        return 2 * ring_bytes_per_rank(sent * FP32, W)
    if o.name == "onebit":
        total = 0.0
        for n in ddp_buckets(numels):
            total += 2 * ring_bytes_per_rank(padded_numel(n, W) // 8, W)  # signs, both phases
            total += 2 * ring_bytes_per_rank(W * FP32, W)  # one scale per chunk, both phases
        return total
    raise ValueError(f"no byte formula for optimizer.name={o.name!r}")
