"""The paper's scale, by formula: Megatron's buckets, both methods' bytes (the communicators'
ring accounting, :func:`scape.comm.step_bytes_per_rank`), the optimizers' memory traffic.
"""

from __future__ import annotations

from collections import Counter

from pipelines.studies.peers_bytes import megatron_buckets  # one formula for both
from scape.basis import selected_count
from scape.comm import GRAD_VALUES, MASKS, PARAM_VALUES, ring_bytes_per_rank, step_bytes_per_rank
from scape.config import ScapeConfig

__all__ = ["PAPER_MODELS", "SCAPE_STEP", "dense_bytes", "megatron_buckets", "scape_bytes",
           "scape_run_bytes", "selected_per_shard", "totals", "traffic_bytes"]  # fmt: skip

PAPER_MODELS = ("gpt-345m", "llama-500m", "llama-1.8b")
SCAPE_STEP = "R6"  # the library's step these formulas and overhead.json's timings are for
VALUE_KINDS = (GRAD_VALUES, PARAM_VALUES)


def selected_per_shard(shards: list[int], sparsity: float) -> list[int]:
    """Coefficients a shard of each size sends at ``sparsity`` (the config's chunk and k)."""
    cfg = ScapeConfig.for_sparsity(sparsity)
    return [selected_count(s, cfg.chunk, cfg.k) for s in shards]


def dense_bytes(n_params: int, world_size: int, value_nbytes: int = 2) -> dict[str, float]:
    """Dense ZeRO-1 per rank per step: the grad reduce-scatter and the param all-gather."""
    nbytes = sum(megatron_buckets(n_params, world_size)) * value_nbytes
    one = ring_bytes_per_rank(nbytes, world_size)
    return {GRAD_VALUES: one, PARAM_VALUES: one, MASKS: 0.0}


def scape_bytes(n_params: int, world_size: int, sparsity: float, value_nbytes: int) -> dict:
    """SCAPE per rank in a sparse step (after the dense warm-up)."""
    shards = [b // world_size for b in megatron_buckets(n_params, world_size)]
    selected = selected_per_shard(shards, sparsity)
    out = step_bytes_per_rank(selected, world_size, value_nbytes, masks=True)
    return {k: out[k] for k in (*VALUE_KINDS, MASKS)}


def scape_run_bytes(n_params: int, world_size: int, cfg: ScapeConfig, steps: int,
                    value_nbytes: int) -> dict[str, float]:  # fmt: skip
    """SCAPE per rank per step, the mean over a run of ``steps`` of ``cfg`` (its density ramp
    included): each dense warm-up step at dense ZeRO-1 bf16's bytes, each sparse step at the
    k of :meth:`~scape.config.ScapeConfig.k_at`."""
    shards = [b // world_size for b in megatron_buckets(n_params, world_size)]
    dense = min(cfg.dense_warmup_steps, steps)
    # steps per k: a step's bytes depend on its k alone, so each k's are computed once
    per_k = Counter(cfg.k_at(step) for step in range(dense + 1, steps + 1))
    total = {kind: dense * v for kind, v in dense_bytes(n_params, world_size).items()}
    for k, count in per_k.items():
        selected = [selected_count(s, cfg.chunk, k) for s in shards]
        one = step_bytes_per_rank(selected, world_size, value_nbytes, masks=True)
        for kind in total:
            total[kind] += count * one.get(kind, 0.0)
    return {kind: v / steps for kind, v in total.items()}


def totals(entry: dict[str, float], dense_total: float) -> dict[str, float]:
    """Total, how many times fewer than dense (``dense_over_this``) and the masks' share
    (``this_over_value_limit``: this total over its values alone)."""
    values = sum(entry.get(k, 0.0) for k in VALUE_KINDS)
    total = values + entry.get(MASKS, 0.0)
    return {"total": total, "dense_over_this": dense_total / total,
            "this_over_value_limit": total / values}  # fmt: skip


def traffic_bytes(world: int, shard: int, selected: int,
                  value_nbytes: int = 2) -> dict[str, dict[str, float]]:  # fmt: skip
    """Bytes each optimizer-side part reads+writes for one bucket (fp32 state, int64 mask
    offsets): SCAPE's parts on every rank (it updates all W*S entries), dense ZeRO-1's."""
    n, wn = world * shard, world * selected
    return {
        "scape": {
            "select": 4 * shard * 3 + 8 * selected,  # moment -> coefficients -> top-k
            "accumulate": 12 * n,  # m, g -> candidate
            "pack": 4 * n + wn * (8 + 4 + value_nbytes),  # candidate at the masks -> wire
            "commit": 16 * n + wn * (value_nbytes + 12),  # wire -> removed; m = cand - removed
            # synced -> q block, decay and update while it is in cache: v and params r/w
            "step": 16 * n + wn * (value_nbytes + 12),
        },
        "dense": {"scale": 8 * n, "update": shard * (4 * 2 * 2 + 4 + 16)},
    }
