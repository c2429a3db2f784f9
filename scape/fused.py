"""SCAPE's step and dense AdamS as fused Triton kernels: the GPU implementation.

The arithmetic is :mod:`scape.shard`'s and :mod:`scape.adams`'s; only the memory layout of
the work differs. A rank's step over a bucket of W shards (``W*S`` entries, chunks of C)
is two passes over memory and one over the shard it owns:

* :func:`pack` (before the all-reduce): ``cand = beta * m + g`` and its coefficients at the
  masks, times 1/W, in the wire dtype, with the rank's finite flag. Reads m and g.
* :func:`finish` (after it): ``m = cand - what this rank sent`` (commit), q decoded from
  the summed buffer, weight decay, the rms (or sign) update of p and v, and the bf16 model
  params. Reads m, g, p, v; writes m, p, v and the bf16 copy. cand is recomputed rather
  than stored: a bucket-sized buffer less, and it is one fused multiply-add.
* :func:`select`: the owner's mask of its shard for the next step, the chunk's DCT in
  registers (one ``(rows, C) @ (C, C)`` dot per block) and its top-k by the same keys as
  :func:`scape.basis.top_offsets`.

Every kernel walks a bucket as rows of one chunk each: row r is chunk ``j`` of shard ``w``;
a shard whose size C does not divide ends in one shorter tail row with its own DCT, so the
tail needs no separate code path. Each kernel call covers a whole bucket (no Python loop over
shards or blocks). Results agree with the CPU implementation to fp32 rounding, not bit for
bit (another summation order, fused multiply-adds); the wire's bf16 rounding is done by hand
(round to nearest even) so that it is the same bits as torch's cast on every backend,
Triton's CPU interpreter included (it truncates).

Imported only where Triton is (``scape.step`` chooses): on CUDA, or on the CPU under
``TRITON_INTERPRET=1`` for the tests.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["adams_fused_", "finish", "pack", "select"]

# Launch configurations: chunk rows per program of the chunked kernels (x 128 lanes at C=100),
# entries per program of the elementwise ones, warps per program, and how the select makes
# the chunks' DCT ("gemm": cuBLAS fp32, then a top-k kernel; "dot": in registers by tl.dot).
# Chosen by measurement: scripts/gpu_tune.py on an H200 (results/gpu/gpu_tune_*.json).
TUNING = {
    "pack": {"ROWS": 16, "num_warps": 4},
    "finish": {"ROWS": 16, "num_warps": 4},
    "topk": {"ROWS": 16, "num_warps": 4},
    "elementwise": {"BLOCK": 2048, "num_warps": 4},
    "select": {"method": "gemm", "precision": "ieee"},
}
# Under Triton's CPU interpreter (the tests on a machine without a GPU) each program runs its
# block as numpy operations, so the cost follows the number of programs, not the block's
# size: 8x the rows per program there makes the fused tests ~4x faster. Every row is computed
# the same way whatever the block (the tests' losses are the same bits at 16, 128 and 1,024
# rows), and a bucket still spans several programs, so the boundary masks stay exercised.
if os.environ.get("TRITON_INTERPRET") == "1":
    for _part in ("pack", "finish", "topk"):
        TUNING[_part] = {**TUNING[_part], "ROWS": 128}
    TUNING["elementwise"] = {**TUNING["elementwise"], "BLOCK": 16384}


@triton.jit
def _round_bf16(x):
    """fp32 -> the fp32 value of the nearest bf16 (ties to even); NaN stays NaN, overflow
    goes to inf, as torch's cast. Stored into a bf16 tensor, it converts exactly."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _rows(pid, n_rows, rows_per_shard, full, shard_size, n_sel, mask_stride, tail_len, k_tail,
          C: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BC: tl.constexpr):  # fmt: skip
    """Geometry of this program's rows: entry offsets (ROWS, BC), their mask, each row's
    offsets into the masks and the wire, its basis (offset, stride), k and validity."""
    r = pid * ROWS + tl.arange(0, ROWS)
    valid = r < n_rows
    w = (r // rows_per_shard).to(tl.int64)
    j = (r % rows_per_shard).to(tl.int64)
    tail = j >= full
    length = tl.where(tail, tail_len, C)
    k = tl.where(tail, k_tail, K)
    c = tl.arange(0, BC)
    entries = (w * shard_size + j * C)[:, None] + c[None, :]
    inside = valid[:, None] & (c[None, :] < length[:, None])
    mask_at = w * mask_stride + j * K  # the row's first selected offset
    wire_at = w * n_sel + j * K
    basis_at = tl.where(tail, C * C, 0)  # the tail's DCT follows the chunk's in one tensor
    return c, entries, inside, valid, mask_at, wire_at, basis_at, length, k


@triton.jit
def _pack_kernel(moment, grad, masks, basis, wire, flag, beta, inv_world,
                 n_rows, rows_per_shard, full, shard_size, n_sel, mask_stride, tail_len, k_tail,
                 C: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BC: tl.constexpr,
                 WIRE_BF16: tl.constexpr):  # fmt: skip
    c, entries, inside, valid, mask_at, wire_at, basis_at, length, k = _rows(
        tl.program_id(0), n_rows, rows_per_shard, full, shard_size, n_sel, mask_stride,
        tail_len, k_tail, C, K, ROWS, BC)  # fmt: skip
    m = tl.load(moment + entries, mask=inside, other=0.0)
    g = tl.load(grad + entries, mask=inside, other=0.0).to(tl.float32)
    cand = m * beta + g
    bad = tl.sum(tl.where(inside & ((cand != cand) | (tl.abs(cand) == float("inf"))), 1, 0))
    # the payload's flag entry, zeroed by the caller: any program that sees one sets it
    tl.store(flag, tl.full((), float("inf"), tl.float32).to(flag.dtype.element_ty), mask=bad > 0)
    for i in range(K):
        on = valid & (i < k)
        offset = tl.load(masks + mask_at + i, mask=on, other=0).to(tl.int64)
        rows = tl.load(basis + basis_at[:, None] + offset[:, None] * length[:, None] + c[None, :],
                       mask=inside & on[:, None], other=0.0)  # fmt: skip
        value = tl.sum(cand * rows, axis=1) * inv_world
        if WIRE_BF16:
            value = _round_bf16(value)
        tl.store(wire + wire_at + i, value.to(wire.dtype.element_ty), mask=on)


@triton.jit
def _dense_pack_kernel(moment, grad, wire, beta, inv_world, world, numel, BLOCK: tl.constexpr,
                       WIRE_BF16: tl.constexpr, RESIDUAL_INTO_GRAD: tl.constexpr):  # fmt: skip
    """The dense warm-up: every entry of ``cand / W`` into ``wire``, which may be ``grad``
    itself (an fp32 wire: the grad buffer is the payload); with ``RESIDUAL_INTO_GRAD`` (a
    narrower wire) what it rounded away, ``cand - W * wire``, goes into ``grad``, where the
    commit reads it. No flag: a non-finite entry reaches the sum itself."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < numel
    cand = tl.load(moment + at, mask=inside, other=0.0) * beta + tl.load(
        grad + at, mask=inside, other=0.0
    ).to(tl.float32)
    value = cand * inv_world
    if WIRE_BF16:
        value = _round_bf16(value)
    tl.store(wire + at, value.to(wire.dtype.element_ty), mask=inside)
    if RESIDUAL_INTO_GRAD:
        tl.store(grad + at, (cand - value * world).to(grad.dtype.element_ty), mask=inside)


@triton.jit
def _update(at, inside, q, param, second_moment, param_out, decay_bits, decay_factor, lr,
            beta2, one_minus_beta2, correction, eps,
            DECAY: tl.constexpr, RMS: tl.constexpr, WRITE_OUT: tl.constexpr):  # fmt: skip
    """Weight decay (on the entries whose bit is set), then the rms or sign step of p with q,
    as scape.shard's weight_decay_, rms_update_ and sign_update_; the bf16 copy last."""
    p = tl.load(param + at, mask=inside, other=0.0)
    if DECAY:
        bits = tl.load(decay_bits + (at >> 3), mask=inside, other=0).to(tl.int32)
        decays = ((bits >> (at & 7).to(tl.int32)) & 1) != 0
        p = tl.where(decays, p * decay_factor, p)
    if RMS:
        v = tl.load(second_moment + at, mask=inside, other=0.0)
        v = v * beta2 + one_minus_beta2 * (q * q)
        denom = tl.sqrt_rn(tl.div_rn(v, correction)) + eps
        p = p - lr * tl.div_rn(q, denom)
        tl.store(second_moment + at, v, mask=inside)
    else:
        p = p - lr * tl.where(q > 0, 1.0, tl.where(q < 0, -1.0, 0.0))
    tl.store(param + at, p, mask=inside)
    if WRITE_OUT:
        tl.store(param_out + at, _round_bf16(p).to(param_out.dtype.element_ty), mask=inside)


@triton.jit
def _finish_kernel(moment, grad, masks, basis, sent, synced, param, second_moment, param_out,
                   decay_bits, clip, beta, world, decay_factor, lr, beta2, one_minus_beta2,
                   correction, eps,
                   n_rows, rows_per_shard, full, shard_size, n_sel, mask_stride, tail_len, k_tail,
                   C: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BC: tl.constexpr,
                   COMMIT: tl.constexpr, UPDATE: tl.constexpr, DECAY: tl.constexpr,
                   RMS: tl.constexpr, WRITE_OUT: tl.constexpr):  # fmt: skip
    c, entries, inside, valid, mask_at, wire_at, basis_at, length, k = _rows(
        tl.program_id(0), n_rows, rows_per_shard, full, shard_size, n_sel, mask_stride,
        tail_len, k_tail, C, K, ROWS, BC)  # fmt: skip
    removed = tl.zeros((ROWS, BC), dtype=tl.float32)
    q = tl.zeros((ROWS, BC), dtype=tl.float32)
    for i in range(K):
        on = valid & (i < k)
        offset = tl.load(masks + mask_at + i, mask=on, other=0).to(tl.int64)
        rows = tl.load(basis + basis_at[:, None] + offset[:, None] * length[:, None] + c[None, :],
                       mask=inside & on[:, None], other=0.0)  # fmt: skip
        if COMMIT:  # what this rank sent, read back from its wire: rounding stays in m
            value = tl.load(sent + wire_at + i, mask=on, other=0.0).to(tl.float32) * world
            removed += value[:, None] * rows
        if UPDATE:
            q += tl.load(synced + wire_at + i, mask=on, other=0.0).to(tl.float32)[:, None] * rows
    if COMMIT:
        m = tl.load(moment + entries, mask=inside, other=0.0)
        g = tl.load(grad + entries, mask=inside, other=0.0).to(tl.float32)
        tl.store(moment + entries, (m * beta + g) - removed, mask=inside)
    if UPDATE:
        q = q * tl.load(clip)
        _update(entries, inside, q, param, second_moment, param_out, decay_bits, decay_factor,
                lr, beta2, one_minus_beta2, correction, eps, DECAY, RMS, WRITE_OUT)  # fmt: skip


@triton.jit
def _dense_finish_kernel(moment, grad, synced, param, second_moment, param_out, decay_bits, clip,
                         decay_factor, lr, beta2, one_minus_beta2, correction, eps, numel,
                         BLOCK: tl.constexpr, COMMIT: tl.constexpr, RESIDUAL: tl.constexpr,
                         UPDATE: tl.constexpr, DECAY: tl.constexpr, RMS: tl.constexpr,
                         WRITE_OUT: tl.constexpr):  # fmt: skip
    """After the dense warm-up's all-reduce: m = 0 (everything was sent), or with
    ``RESIDUAL`` m = what the wire rounded away (left in ``grad`` by the pack); the update
    with q = the summed buffer."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < numel
    if COMMIT:
        if RESIDUAL:
            m = tl.load(grad + at, mask=inside, other=0.0).to(tl.float32)
        else:
            m = tl.zeros((BLOCK,), dtype=tl.float32)
        tl.store(moment + at, m, mask=inside)
    if UPDATE:
        q = tl.load(synced + at, mask=inside, other=0.0).to(tl.float32) * tl.load(clip)
        _update(at, inside, q, param, second_moment, param_out, decay_bits, decay_factor, lr,
                beta2, one_minus_beta2, correction, eps, DECAY, RMS, WRITE_OUT)  # fmt: skip


@triton.jit
def _store_top_offsets(coefs, c, r, inside, length, out, out_stride, K: tl.constexpr,
                       ROWS: tl.constexpr, BC: tl.constexpr):  # fmt: skip
    """Per row of ``coefs`` (ROWS, BC), the offsets of the K largest |coefficients|, ascending,
    by :func:`scape.basis.top_offsets`' keys: |coef| with its low 8 bits replaced by the
    offset (distinct in a row, so K successive maxima are one set)."""
    keys = ((tl.abs(coefs).to(tl.int32, bitcast=True) >> 8) << 8) | c[None, :]
    keys = tl.where(c[None, :] < length, keys, -1)
    chosen = tl.zeros((ROWS, BC), dtype=tl.int32)
    for _ in range(K):
        hit = keys == tl.max(keys, axis=1)[:, None]
        chosen = tl.where(hit, 1, chosen)
        keys = tl.where(hit, -1, keys)
    slot = tl.cumsum(chosen, axis=1) - 1  # the chosen offsets in ascending order
    offsets = tl.zeros((ROWS, BC), dtype=tl.int32) + c[None, :]
    tl.store(out + r.to(tl.int64)[:, None] * out_stride + slot,
             offsets.to(out.dtype.element_ty), mask=inside & (chosen > 0))  # fmt: skip


@triton.jit
def _topk_kernel(coefs, out, n_rows, length, out_stride, K: tl.constexpr, ROWS: tl.constexpr,
                 BC: tl.constexpr):  # fmt: skip
    """Rows of ``length`` coefficients (the chunks' DCT, made by a GEMM): their top K."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BC)
    inside = (r < n_rows)[:, None] & (c[None, :] < length)
    x = tl.load(coefs + r.to(tl.int64)[:, None] * length + c[None, :], mask=inside, other=0.0)
    _store_top_offsets(x, c, r, inside, length, out, out_stride, K, ROWS, BC)


@triton.jit
def _select_dot_kernel(moment, grad, basis, out, beta, n_rows, length, out_stride,
                       K: tl.constexpr, ROWS: tl.constexpr, BC: tl.constexpr,
                       FROM_CANDIDATE: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """The select in one pass: rows of ``length`` entries (all chunks, or the one tail), their
    DCT (basis (length, length)) by tl.dot in registers, and their top K."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BC)
    inside = (r < n_rows)[:, None] & (c[None, :] < length)
    at = r.to(tl.int64)[:, None] * length + c[None, :]
    x = tl.load(moment + at, mask=inside, other=0.0)
    if FROM_CANDIDATE:  # after a dense step: the statistic is what was just sent in full
        x = x * beta + tl.load(grad + at, mask=inside, other=0.0).to(tl.float32)
    square = (c[:, None] < length) & (c[None, :] < length)
    basis_t = tl.load(basis + c[None, :] * length + c[:, None], mask=square, other=0.0)
    coefs = tl.dot(x, basis_t, input_precision=PRECISION)  # coefs[r, j] = <x_r, D_j>
    _store_top_offsets(coefs, c, r, inside, length, out, out_stride, K, ROWS, BC)


@triton.jit
def _adams_kernel(param, exp_avg, grad, numel, lr, beta1, one_minus_beta1, beta2,
                  one_minus_beta2, eps, bias_correction, step_size, decay_factor,
                  BLOCK: tl.constexpr, DECAY: tl.constexpr):  # fmt: skip
    """scape.adams.adams_update_ in one pass: decay, denominator from m_{t-1} and g, m, p."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < numel
    p = tl.load(param + at, mask=inside, other=0.0)
    m = tl.load(exp_avg + at, mask=inside, other=0.0)
    g = tl.load(grad + at, mask=inside, other=0.0).to(tl.float32)
    if DECAY:
        p = p * decay_factor
    m_hat = tl.div_rn(m, bias_correction)
    denom = tl.sqrt_rn(m_hat * m_hat * beta2 + one_minus_beta2 * (g * g)) + eps
    m = m * beta1 + one_minus_beta1 * g
    p = p - step_size * tl.div_rn(m, denom)
    tl.store(exp_avg + at, m, mask=inside)
    tl.store(param + at, p, mask=inside)


# --------------------------------------------------------------------------- launchers
def _block_cols(chunk: int) -> int:
    return max(16, triton.next_power_of_2(chunk))


def _rows_args(geo, masks: Tensor) -> tuple:
    """The row arguments every chunked kernel takes, from a :class:`scape.step.Geometry` and
    the bucket's masks (W, n) (rows may be strided: views of one buffer of every bucket)."""
    return (geo.n_rows, geo.rows_per_shard, geo.full, geo.shard_size, geo.num_selected,
            masks.stride(0), geo.tail, geo.k_tail)  # fmt: skip


def pack(geo, moment: Tensor, grad: Tensor, masks: Tensor | None, basis: Tensor, wire: Tensor,
         flag: Tensor | None, *, beta: float, world_size: int) -> None:  # fmt: skip
    """This rank's values of one bucket into ``wire`` (W*n,), and into ``flag`` (a 1-entry
    view, zeroed by the caller) inf where any entry of ``beta * moment + grad`` is not finite.
    ``masks`` None, the dense warm-up: every entry into ``wire`` (W*S,), which is ``grad``
    itself for an fp32 wire; for a narrower one what it rounds away goes into ``grad``."""
    bf16 = wire.dtype == torch.bfloat16
    if masks is None:
        numel, cfg = moment.numel(), TUNING["elementwise"]
        grid = (triton.cdiv(numel, cfg["BLOCK"]),)
        _dense_pack_kernel[grid](moment, grad, wire, beta, 1.0 / world_size, float(world_size),
                                 numel, BLOCK=cfg["BLOCK"], WIRE_BF16=bf16,
                                 RESIDUAL_INTO_GRAD=wire.data_ptr() != grad.data_ptr(),
                                 num_warps=cfg["num_warps"])  # fmt: skip
        return
    cfg = TUNING["pack"]
    grid = (triton.cdiv(geo.n_rows, cfg["ROWS"]),)
    _pack_kernel[grid](moment, grad, masks, basis, wire, flag, beta, 1.0 / world_size,
                       *_rows_args(geo, masks), C=geo.chunk, K=geo.k, ROWS=cfg["ROWS"],
                       BC=_block_cols(geo.chunk), WIRE_BF16=bf16,
                       num_warps=cfg["num_warps"])  # fmt: skip


def finish(geo, moment: Tensor, grad: Tensor, masks: Tensor | None, basis: Tensor,
           sent: Tensor | None, synced: Tensor, *, beta: float, world_size: int, commit: bool,
           param: Tensor | None = None, second_moment: Tensor | None = None,
           param_out: Tensor | None = None, decay_bits: Tensor | None = None,
           clip: Tensor | None = None, decay_factor: float = 1.0, lr: float = 0.0,
           beta2: float = 0.0, correction: float = 1.0, eps: float = 0.0,
           residual_in_grad: bool = False) -> None:  # fmt: skip
    """Commit (``m = beta * m + g - W * sent``; after the dense warm-up m = 0, or with
    ``residual_in_grad`` m = what its narrower wire rounded away, which the pack left in
    ``grad``) and, with ``param``, decode ``synced`` into q (times ``clip``, a 1-entry device
    tensor) and step ``param`` (weight decay where ``decay_bits`` is set), and
    ``second_moment`` (rms; None: sign), writing ``param_out`` (bf16) when given. A tensor
    argument a specialization never reads gets ``moment`` as a stand-in pointer."""
    unused = moment
    update = param is not None
    tensors = tuple(unused if t is None else t
                    for t in (param, second_moment, param_out, decay_bits, clip))  # fmt: skip
    scalars = (decay_factor, lr, beta2, 1.0 - beta2, correction, eps)
    flags = dict(UPDATE=update, DECAY=update and decay_bits is not None and decay_factor != 1.0,
                 RMS=update and second_moment is not None,
                 WRITE_OUT=update and param_out is not None)  # fmt: skip
    if masks is None:
        numel, cfg = moment.numel(), TUNING["elementwise"]
        grid = (triton.cdiv(numel, cfg["BLOCK"]),)
        _dense_finish_kernel[grid](moment, grad, synced, *tensors, *scalars, numel,
                                   BLOCK=cfg["BLOCK"], COMMIT=commit, RESIDUAL=residual_in_grad,
                                   num_warps=cfg["num_warps"], **flags)  # fmt: skip
        return
    cfg = TUNING["finish"]
    grid = (triton.cdiv(geo.n_rows, cfg["ROWS"]),)
    _finish_kernel[grid](moment, grad, masks, basis, unused if sent is None else sent, synced,
                         *tensors, beta, float(world_size), *scalars, *_rows_args(geo, masks),
                         C=geo.chunk, K=geo.k, ROWS=cfg["ROWS"], BC=_block_cols(geo.chunk),
                         COMMIT=commit, num_warps=cfg["num_warps"], **flags)  # fmt: skip


def _ieee_mm(x: Tensor, basis_t: Tensor, out: Tensor) -> Tensor:
    """``x @ basis_t`` in full fp32 whatever the process's TF32 setting (TF32 keeps 10
    mantissa bits: the keys compare 15)."""
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return torch.mm(x, basis_t, out=out)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def select(geo, moment_shard: Tensor, grad_shard: Tensor | None, basis: Tensor, out: Tensor, *,
           beta: float, scratch: Tensor | None = None) -> None:  # fmt: skip
    """The owner's mask of one shard (S,) into ``out`` (n,): top-k per chunk of the DCT of
    ``moment_shard``, or of ``beta * moment_shard + grad_shard`` when a grad is given.
    ``TUNING["select"]`` says how the DCT is made; the GEMM's coefficients go into
    ``scratch`` (S,) fp32 when given."""
    method = TUNING["select"]["method"]
    from_candidate = grad_shard is not None
    parts = [(0, geo.full, geo.chunk, geo.k, 0)] if geo.full else []
    if geo.tail:
        parts.append((geo.full * geo.chunk, 1, geo.tail, geo.k_tail, geo.chunk * geo.chunk))
    bc = _block_cols(geo.chunk)
    if method == "dot":
        for start, rows, length, k, basis_at in parts:
            grid = (triton.cdiv(rows, 32),)
            _select_dot_kernel[grid](moment_shard[start:], (grad_shard if from_candidate
                                     else moment_shard)[start:], basis[basis_at:],
                                     out[start // geo.chunk * geo.k :], beta, rows, length, k,
                                     K=k, ROWS=32, BC=bc, FROM_CANDIDATE=from_candidate,
                                     PRECISION=TUNING["select"]["precision"])  # fmt: skip
        return
    x = torch.add(grad_shard, moment_shard, alpha=beta) if from_candidate else moment_shard
    coefs = torch.empty_like(x) if scratch is None else scratch[: x.numel()]
    cfg = TUNING["topk"]
    for start, rows, length, k, basis_at in parts:
        block = slice(start, start + rows * length)
        _ieee_mm(x[block].view(rows, length),
                 basis[basis_at : basis_at + length * length].view(length, length).t(),
                 coefs[block].view(rows, length))  # fmt: skip
        grid = (triton.cdiv(rows, cfg["ROWS"]),)
        _topk_kernel[grid](coefs[block], out[start // geo.chunk * geo.k :], rows, length, k,
                           K=k, ROWS=cfg["ROWS"], BC=bc, num_warps=cfg["num_warps"])  # fmt: skip


def adams_fused_(param: Tensor, exp_avg: Tensor, grad: Tensor, *, step: int, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float = 0.0) -> None:  # fmt: skip
    """:func:`scape.adams.adams_update_` as one kernel (one read of p, m, g, one write of p, m)."""
    numel, cfg = param.numel(), TUNING["elementwise"]
    bias_correction = 1.0 - beta1**step
    grid = (triton.cdiv(numel, cfg["BLOCK"]),)
    _adams_kernel[grid](param, exp_avg, grad, numel, lr, beta1, 1.0 - beta1, beta2, 1.0 - beta2,
                        eps, bias_correction, lr / bias_correction, 1.0 - lr * weight_decay,
                        BLOCK=cfg["BLOCK"], DECAY=weight_decay != 0.0,
                        num_warps=cfg["num_warps"])  # fmt: skip
