"""What each reading costs at the paper's shapes: bytes per rank per step and optimizer memory.

Formulas, not measurements (the byte counters of the simulator and the communicator are
tested to equal them at small sizes); the library's step (``method: scape``) is booked by
the library's own formula, :func:`scape.comm.step_bytes_per_rank` (one byte per mask
coefficient), the readings by the encodings they would need. Ring collectives: a reduce-scatter or all-gather of
T bytes costs each rank (W - 1) / W * T. Values travel in bf16 (2 bytes), as the reference
doc's table assumes for dense ZeRO-1 and SCAPE alike. Optimizer memory counts what a rank
holds beyond the model's own bf16 params and fp32 gradient buffer, which every method has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipelines.studies.quality_config import VariantSpec
from scape.comm import MASKS, ring_bytes_per_rank, step_bytes_per_rank
from scape.peers.dgc import num_selected

__all__ = ["ReadingCost", "reading_cost"]

VALUE_BYTES = 2  # bf16 on the wire
FP32 = 4
SHARD_BUCKET = 40_000_000  # Megatron's default bucket at this scale, for the mask encodings


@dataclass(frozen=True)
class ReadingCost:
    bytes_per_step: float  # per rank, all collectives of one step
    mask_bytes: float  # the part of bytes_per_step that is mask indices
    memory: float  # optimizer state per rank, bytes
    memory_note: str


# fp32 buffers each local-moment update keeps per entry beyond the moment and main params
UPDATE_STATE = {"sign": (0, ""), "rms": (1, " + v"), "adams": (1, " + M"),
                "adams_coef": (1, " + M"), "adam": (2, " + M + v")}  # fmt: skip

OFFSET_BLOCK = 1 << 16  # offset16: 16-bit offsets inside 64Ki-entry blocks, 4-byte counts


def mask_nbytes(shard_size: int, k: int) -> int:
    """Bytes of one shard's k sorted in-shard indices in the cheapest fixed encoding the
    owner readings' (R0/R1/R3/R4) masks would travel in: 32-bit indices, 16-bit offsets
    with a count per 64Ki-entry block, or a bitmap."""
    return min(
        4 * k,
        2 * k + 4 * math.ceil(shard_size / OFFSET_BLOCK),
        math.ceil(shard_size / 8),
    )


def _mask_bytes_per_shard_layout(n: int, w: int, density: float) -> float:
    """All-gather of every owner's mask of every bucket, in the cheapest fixed encoding."""
    buckets = max(1, math.ceil(n / SHARD_BUCKET))
    shard = math.ceil(n / buckets / w)
    k = num_selected(shard, density)
    return ring_bytes_per_rank(mask_nbytes(shard, k) * w * buckets, w)


def reading_cost(variant: VariantSpec, n: int, w: int) -> ReadingCost:
    """Bytes and memory of ``variant`` for an ``n``-parameter model on ``w`` ranks."""
    dense_values = 2 * ring_bytes_per_rank(n * VALUE_BYTES, w)  # reduce-scatter + all-gather
    zero1 = 2 * FP32 * n / w  # sharded fp32 main params and AdamS's m
    rho = variant.exchanged_density()
    if variant.method in ("adams", "adamw") or rho >= 1.0:
        extra = FP32 * n / w if variant.method != "adams" else 0.0  # AdamW's / RMSprop's v
        return ReadingCost(dense_values, 0.0, zero1 + extra, "ZeRO-1: main params, m (, v)")
    if variant.method == "scape":  # the library's step: its own byte formula (scape.comm)
        options = {"reading": "local", "chunk": 100, "update": "rms", **variant.options}
        sent = step_bytes_per_rank([rho * n / w], w, VALUE_BYTES, masks=True)
        memory, note = _local_memory(options, n)
        return ReadingCost(sum(sent.values()), sent[MASKS], memory, note)
    values = 2 * ring_bytes_per_rank(rho * n * VALUE_BYTES, w)
    options = variant.options
    kind, chunk = options.get("reading"), options.get("chunk", 64)
    if kind == "dgc":  # every rank's own values and int32 indices, all-gathered: grows with W
        sent = rho * n * (VALUE_BYTES + 4) * w
        memory = 4 * FP32 * n
        return ReadingCost(ring_bytes_per_rank(sent, w), ring_bytes_per_rank(rho * n * 4 * w, w),
                           memory, "local u and v + replicated m and fp32 main params")  # fmt: skip
    if kind == "local" or (kind == "owner" and options.get("basis") == "dct"):
        index_bits = max(1, math.ceil(math.log2(chunk)))
        if options.get("scope") == "shard":
            index_bits = 16  # in-shard offsets (offset16)
        masks = ring_bytes_per_rank(rho * n * index_bits / 8, w)
        if kind == "local" and options.get("mask_owner") == "per_rank":
            # every rank's own values and indices, all-gathered: grows with W
            sent = rho * n * (VALUE_BYTES + index_bits / 8) * w
            memory, note = _local_memory(options, n)
            return ReadingCost(ring_bytes_per_rank(sent, w), 0.0, memory, note)
    else:
        masks = _mask_bytes_per_shard_layout(n, w, rho)
    total = values + masks
    if kind == "local":
        memory, note = _local_memory(options, n)
    elif kind == "owner" and options.get("off_mask", "freeze") != "freeze":
        memory, note = 2 * FP32 * n, "replicated m and fp32 main params"
    else:
        ef = options.get("error_feedback", False)
        memory = zero1 + FP32 * n / w + (FP32 * n if ef else 0.0)  # + age (int32)
        note = "ZeRO-1 + age" + (" + local residual" if ef else "")
    return ReadingCost(total, masks, memory, note)


def _local_memory(options: dict, n: int) -> tuple[float, str]:
    """Local moment (every entry) + replicated fp32 main params + the update's own state."""
    state, names = UPDATE_STATE[options.get("update", "rms")]
    return FP32 * n * (2 + state), f"local moment + replicated fp32 main params{names}"
