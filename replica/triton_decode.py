"""Paged decode attention as a Triton kernel: reads K/V through the block table, in place.

One program per (sequence, KV head, context split) computes the attention of that head's group of
query heads (grouped-query attention) over its share of the context with an online softmax, so no
contiguous copy of the cache is ever made. The group is padded to 16 rows for the matrix
instructions. Context lengths come from a device tensor, so the kernel is captured unchanged in
CUDA graphs.

Why splits: a small batch gives few (sequence, head) programs for the 132 multiprocessors, each
walking its whole context alone. Splitting the context (flash-decoding) multiplies the programs
until there are about two per multiprocessor; at batch 32 with 8 KV heads there already are, and
more splits measured slower on the H200 (docs/bench/h200_decode_attention_sweep.json). The splits'
partial results meet without a second kernel: each program leaves its partial sums in a scratch
buffer and counts itself in with an atomic; the last of a (sequence, head) to arrive merges them and
resets the counter for the next call.

An FP8 cache (replica/kv_quant.py) is read as e4m3 and widened for the products to float16 by
default: Hopper converts e4m3 pairs to float16 in one instruction, while bfloat16 takes a detour
through float32 (the same values either way: every e4m3 number is exact in both). The query and the
softmax weights join it in float16 (q's bfloat16 rounds to float16's finer mantissa; |q| past
65,504 would overflow, far above any model's queries). The per-tensor scales apply once: the K
scale to the scores, the V scale to the output. With rope the kernel stores the new key and value
quantised as `rope_and_cache` does.

Triton ships with torch's CUDA builds; it is imported only when a CUDA engine first needs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.kv_quant import UNIT_SCALES, KVScales, is_fp8
from replica.triton_fused import to_cache

# Arrival counters, one per (sequence, KV head), zero between calls. Allocated once per device and
# never replaced: a captured CUDA graph keeps the address it saw.
_COUNTER_SLOTS = 1 << 16
_counters: dict[torch.device, torch.Tensor] = {}
_unused: dict[torch.device, torch.Tensor] = {}  # a float32 pointer for launches without splits
_WIDEN = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}  # an FP8 cache's products' dtype
_TARGET_PROGRAMS = 256  # about 2 per H200 multiprocessor; more splits measured slower at batch 32


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, part_acc_ptr, part_ml_ptr, counter_ptr, scale,
    k_scale, v_scale, inv_k, inv_v, pos_ptr, rope_ptr, slot_ptr,
    stride_q_tok, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_table,
    stride_o_tok, stride_o_head,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TOKENS: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    ROPE: tl.constexpr, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, FP8: tl.constexpr,
    WIDEN: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + seq)
    per_split = tl.cdiv(tl.cdiv(ctx, TOKENS), SPLITS) * TOKENS
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows
    row_ok = rows < GROUP
    q_rows = q_ptr + seq * stride_q_tok + heads[:, None] * stride_q_head
    if ROPE:  # q_ptr is the step's qkv rows, not yet rotated: rotate q here, and k and v into the cache
        q = _rope_and_store(
            q_ptr, q_rows, k_ptr, v_ptr, pos_ptr, rope_ptr, slot_ptr, seq, kv_head, ctx, start, end, row_ok,
            stride_q_tok, stride_k_block, stride_k_slot, stride_k_head, inv_k, inv_v,
            HEAD_DIM, BLOCK_SIZE, Q_HEADS, KV_HEADS, FP8,
        )  # fmt: skip
    else:
        q = tl.load(q_rows + dims[None, :], mask=row_ok[:, None], other=0.0)
    if FP8:  # the products' dtype: the cache's e4m3 widens to WIDEN, and q with it
        q = q.to(WIDEN)
    qk_scale = scale * k_scale  # an FP8 cache's K scale, applied to the scores (1.0 otherwise)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    offs = tl.arange(0, TOKENS)
    for first in range(start, end, TOKENS):
        pos = first + offs
        valid = pos < end
        block = tl.load(tables_ptr + seq * stride_table + pos // BLOCK_SIZE, mask=valid, other=0)
        base = (
            block.to(tl.int64) * stride_k_block + (pos % BLOCK_SIZE) * stride_k_slot + kv_head * stride_k_head
        )
        k = tl.load(k_ptr + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    if FP8:  # the V scale, once per output (the splits' merge is linear in acc)
        acc = acc * v_scale
    out_ptrs = out_ptr + seq * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :]
    if SPLITS == 1:
        tl.store(out_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        group_id = seq * tl.num_programs(1) + kv_head
        tile = rows[:, None] * HEAD_DIM + dims[None, :]
        mine = (group_id * SPLITS + split).to(tl.int64)
        tl.store(part_acc_ptr + mine * GROUP_PAD * HEAD_DIM + tile, acc)
        tl.store(part_ml_ptr + (mine * 2) * GROUP_PAD + rows, m_i)
        tl.store(part_ml_ptr + (mine * 2 + 1) * GROUP_PAD + rows, l_i)
        # One thread does the scalar atomic, and its release orders only its own stores: the
        # barrier first puts every warp's partial stores before it. acq_rel then makes them
        # visible before the count, and the last arrival sees everyone's.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + group_id, 1, sem="acq_rel")
        if arrived == SPLITS - 1:
            _merge_splits(
                part_acc_ptr, part_ml_ptr, group_id, out_ptrs, row_ok, tile, rows, GROUP_PAD, HEAD_DIM, SPLITS
            )  # fmt: skip
            tl.store(counter_ptr + group_id, 0)


@triton.jit
def _rotate(x_ptrs, partner_ptrs, cos, sin, sign, mask, dt: tl.constexpr):
    """transformers' x * cos + rotate_half(x) * sin, each product and the sum rounded to dt: the
    rounding steps of `replica.triton_fused.rope_and_cache`."""
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    partner = tl.load(partner_ptrs, mask=mask, other=0.0).to(tl.float32)
    return ((x * cos).to(dt).to(tl.float32) + (sign * partner * sin).to(dt).to(tl.float32)).to(dt)


@triton.jit
def _rope_and_store(
    qkv_ptr, q_rows, k_ptr, v_ptr, pos_ptr, rope_ptr, slot_ptr, seq, kv_head, ctx, start, end, row_ok,
    stride_tok, stride_k_block, stride_k_slot, stride_k_head, inv_k, inv_v,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    FP8: tl.constexpr,
):  # fmt: skip
    """The rotated q of this program's head group. The program whose context share holds the new
    token (position ctx - 1) also rotates its key and stores key and value at the token's slot; a
    barrier makes the stores visible to the rest of the program before its loop reads them. The
    rotation rounds to the model dtype (qkv's); the stores cast or quantise to the cache's."""
    dt = qkv_ptr.dtype.element_ty
    cdt = k_ptr.dtype.element_ty
    dims = tl.arange(0, HEAD_DIM)
    partner = (dims + HEAD_DIM // 2) % HEAD_DIM  # rotate_half's source column
    sign = tl.where(dims < HEAD_DIM // 2, -1.0, 1.0)
    row = rope_ptr + tl.load(pos_ptr + seq).to(tl.int64) * 2 * HEAD_DIM  # [positions, 2, HEAD_DIM] f32
    cos = tl.load(row + dims).to(dt).to(tl.float32)
    sin = tl.load(row + HEAD_DIM + dims).to(dt).to(tl.float32)
    q = _rotate(q_rows + dims[None, :], q_rows + partner[None, :], cos[None, :], sin[None, :], sign[None, :],
                row_ok[:, None], dt)  # fmt: skip
    if (start <= ctx - 1) & (ctx - 1 < end):
        token = qkv_ptr + seq.to(tl.int64) * stride_tok
        k_row = token + (Q_HEADS + kv_head) * HEAD_DIM
        k = _rotate(k_row + dims, k_row + partner, cos, sin, sign, dims < HEAD_DIM, dt)  # (all true)
        v = tl.load(token + (Q_HEADS + KV_HEADS + kv_head) * HEAD_DIM + dims)
        slot = tl.load(slot_ptr + seq).to(tl.int64)
        dest = (
            (slot // BLOCK_SIZE) * stride_k_block
            + (slot % BLOCK_SIZE) * stride_k_slot
            + kv_head * stride_k_head
        )
        tl.store(k_ptr + dest + dims, to_cache(k, inv_k, cdt, FP8))
        tl.store(v_ptr + dest + dims, to_cache(v, inv_v, cdt, FP8))
        tl.debug_barrier()
    return q


@triton.jit
def _merge_splits(
    part_acc_ptr, part_ml_ptr, group_id, out_ptrs, row_ok, tile, rows,
    GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    # Split 0 always holds context (every sequence has at least one token), so its maximum is finite
    # and an empty split (maximum -inf) merges with weight exp(-inf) = 0.
    first = (group_id * SPLITS).to(tl.int64)
    m = tl.load(part_ml_ptr + (first * 2) * GROUP_PAD + rows, cache_modifier=".cg")
    l_sum = tl.load(part_ml_ptr + (first * 2 + 1) * GROUP_PAD + rows, cache_modifier=".cg")
    acc = tl.load(part_acc_ptr + first * GROUP_PAD * HEAD_DIM + tile, cache_modifier=".cg")
    for s in tl.static_range(1, SPLITS):
        part = first + s
        m_s = tl.load(part_ml_ptr + (part * 2) * GROUP_PAD + rows, cache_modifier=".cg")
        l_s = tl.load(part_ml_ptr + (part * 2 + 1) * GROUP_PAD + rows, cache_modifier=".cg")
        acc_s = tl.load(part_acc_ptr + part * GROUP_PAD * HEAD_DIM + tile, cache_modifier=".cg")
        m_new = tl.maximum(m, m_s)
        a, b = tl.exp(m - m_new), tl.exp(m_s - m_new)
        l_sum = l_sum * a + l_s * b
        acc = acc * a[:, None] + acc_s * b[:, None]
        m = m_new
    tl.store(out_ptrs, (acc / l_sum[:, None]).to(out_ptrs.dtype.element_ty), mask=row_ok[:, None])


def default_splits(batch: int, kv_heads: int, max_context: int, tokens: int) -> int:
    """Splits that bring the launch near `_TARGET_PROGRAMS` programs, at most one per tile of the
    longest context the table holds (shorter contexts leave some splits empty; they merge as zero).

    A function of the batch shape only (never of the step's context lengths, which live on the
    device), so a CUDA graph captured for a batch size keeps its split count. The summation order,
    and so the last bit of the result, therefore depends on how many rows the launch has."""
    splits = 1
    while batch * kv_heads * splits * 2 <= _TARGET_PROGRAMS and splits * 2 * tokens <= max_context:
        splits *= 2
    return min(splits, 16)


def _counter(device: torch.device) -> torch.Tensor:
    """The arrival counters of `device`. The engine's eager warm-up creates them before any graph
    capture; created inside one, they would belong to that graph's pool and its zero-fill to that
    graph alone. One stream at a time may run split launches on a device: they share the counters."""
    if device not in _counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("run paged_decode_attention once outside a CUDA graph capture first")
        _counters[device] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)
        _unused[device] = torch.empty(1, dtype=torch.float32, device=device)  # see paged_decode_attention
    return _counters[device]


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    tokens_per_iter: int = 128,
    splits: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    kv_scales: KVScales = UNIT_SCALES,
    fp8_widen: torch.dtype = torch.float16,
) -> torch.Tensor:
    """q [B, heads, D]; caches [blocks, block_size, kv_heads, D]; tables [B, W]; lens [B] -> [B, heads, D].

    `rope` = (positions [B], table [positions, 2, D] float32, slots [B]): q is then the query part of
    the step's qkv rows [B, (heads + 2 kv_heads) D] before the rotary embedding, and the kernel also
    does what `replica.triton_fused.rope_and_cache` would: rotates q and k and stores k and v at the
    slots (one launch fewer per layer). Each row's slot must be its own: no other row of the call
    reads it (a program reads back only the key it stored itself). Padded graph rows all use slot 0
    of the reserved block 0; they store the same key there and their outputs are dropped.

    `splits` defaults to `default_splits` over the table's width (the longest context it can hold).
    An FP8 cache (float8_e4m3fn) is read with `kv_scales` and, with rope, written with them; its
    products run in `fp8_widen` (float16 or bfloat16, see the module's docstring).
    """
    batch, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    tokens = max(tokens_per_iter, block_size)
    if splits is None:  # float32 is the exactness reference (tests compare eager, graphed and
        # transformers' outputs), so it keeps one summation order whatever the batch size
        fp32 = q.dtype == torch.float32
        splits = 1 if fp32 else default_splits(batch, kv_heads, block_tables.shape[1] * block_size, tokens)
    if splits > 1 and batch * kv_heads > _COUNTER_SLOTS:
        raise ValueError(f"split launches take at most {_COUNTER_SLOTS} (sequence, KV head) pairs")
    fp8 = is_fp8(k_cache)
    if fp8 != is_fp8(v_cache) or (not fp8 and (k_cache.dtype != q.dtype or v_cache.dtype != q.dtype)):
        raise ValueError("the K and V caches must share q's dtype, or both be float8_e4m3fn")
    if fp8_widen not in _WIDEN:
        raise ValueError(f"an FP8 cache widens to float16 or bfloat16, not {fp8_widen}")
    if rope is not None and q.stride(1) != dim:
        raise ValueError("with rope, q must be qkv rows' query part")
    if rope is not None and batch > 1 and q.stride(0) < (heads + 2 * kv_heads) * dim:  # (one row: any stride)
        raise ValueError("with rope, q must be the query part of the step's qkv rows (k and v follow it)")
    out = torch.empty((batch, heads, dim), dtype=q.dtype, device=q.device)
    counters = _counter(q.device)
    if splits > 1:
        parts = batch * kv_heads * splits
        part_acc = torch.empty(parts * group_pad * dim, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(parts * 2 * group_pad, dtype=torch.float32, device=q.device)
    else:  # the kernel never touches them: a standing float32 pointer, no allocation per layer and step
        part_acc = part_ml = _unused[q.device]
    positions, table, slots = rope if rope is not None else (context_lens, context_lens, context_lens)
    _paged_decode_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, out, block_tables, context_lens, part_acc, part_ml, counters, scale,
        kv_scales.k, kv_scales.v, *kv_scales.inverse, positions, table, slots,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=dim,
        BLOCK_SIZE=block_size, TOKENS=tokens, SPLITS=splits,
        ROPE=rope is not None, Q_HEADS=heads, KV_HEADS=kv_heads, FP8=fp8,
        WIDEN=tl.float32 if q.dtype == torch.float32 else _WIDEN[fp8_widen],  # float32 stays exact
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # float32 stays exact; bf16 ignores it
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
