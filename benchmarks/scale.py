"""Bytes per rank per step at the paper's scale: Megatron's buckets and the two exchanges.

No measurement: the same formulas the communicators count with (ring accounting, (W-1)/W of
a collective's size per rank), applied to Megatron's bucket rule at W ranks. SCAPE's side is
:func:`scape.comm.step_bytes_per_rank`, the function the simulator's and the Megatron
adapter's counters are tested against, so a table here cannot drift from what runs.

* dense ZeRO-1 (Megatron's distributed optimizer): per bucket one reduce-scatter of the
  gradients and one all-gather of the parameters, in ``value_nbytes`` each (bf16: 2);
* SCAPE (the library's step): per bucket one all-reduce of the W shards' selected DCT
  coefficients and a finite flag (booked half as gradient sync, half as what the abstract
  calls parameter reconstruction: there is no parameter all-gather), and per step one
  all-gather of the next step's masks, one byte per selected coefficient.
"""

from __future__ import annotations

import math

from scape.basis import selected_count
from scape.comm import GRAD_VALUES, MASKS, PARAM_VALUES, ring_bytes_per_rank, step_bytes_per_rank
from scape.config import ScapeConfig

__all__ = [
    "PAPER_MODELS",
    "dense_bytes",
    "megatron_buckets",
    "scape_bytes",
    "scape_selected",
    "totals",
]

PAPER_MODELS = ("gpt-345m", "llama-500m", "llama-1.8b")
VALUE_KINDS = (GRAD_VALUES, PARAM_VALUES)


def megatron_buckets(n_params: int, world_size: int) -> list[int]:
    """Bucket sizes as Megatron's DDP makes them: max(40M, 1M * W) elements, padded to lcm(W, 128)."""
    bucket = max(40_000_000, 1_000_000 * world_size)
    pad = math.lcm(world_size, 128)
    sizes = [bucket] * (n_params // bucket)
    if n_params % bucket:
        sizes.append(n_params % bucket)
    return [math.ceil(s / pad) * pad for s in sizes]


def scape_selected(buckets: list[int], world_size: int, sparsity: float) -> list[int]:
    """Coefficients each shard of each bucket sends at ``sparsity`` (the config's chunk and k)."""
    cfg = ScapeConfig.for_sparsity(sparsity)
    return [selected_count(b // world_size, cfg.chunk, cfg.k) for b in buckets]


def dense_bytes(n_params: int, world_size: int, value_nbytes: int = 2) -> dict[str, float]:
    """Dense ZeRO-1 per rank per step: the grad reduce-scatter and the param all-gather."""
    nbytes = sum(megatron_buckets(n_params, world_size)) * value_nbytes
    one = ring_bytes_per_rank(nbytes, world_size)
    return {GRAD_VALUES: one, PARAM_VALUES: one, MASKS: 0.0}


def scape_bytes(n_params: int, world_size: int, sparsity: float, value_nbytes: int) -> dict:
    """SCAPE per rank in a sparse step (after the dense warm-up)."""
    selected = scape_selected(megatron_buckets(n_params, world_size), world_size, sparsity)
    out = step_bytes_per_rank(selected, world_size, value_nbytes, masks=True)
    return {k: out[k] for k in (*VALUE_KINDS, MASKS)}


def totals(entry: dict[str, float], dense_total: float) -> dict[str, float]:
    """Total, how many times fewer than dense (``dense_over_this``) and the masks' share
    (``this_over_value_limit``: this total over its values alone)."""
    values = sum(entry.get(k, 0.0) for k in VALUE_KINDS)
    total = values + entry.get(MASKS, 0.0)
    return {"total": total, "dense_over_this": dense_total / total,
            "this_over_value_limit": total / values}  # fmt: skip
