"""Paged decode attention as a Triton kernel: reads K/V through the block table, in place.

One program per (sequence, KV head) computes the attention of that head's group of query heads
(grouped-query attention) over the sequence's context with an online softmax, so no contiguous copy
of the cache is ever made. The group is padded to 16 rows for the matrix instructions. Context
lengths come from a device tensor, so the kernel is captured unchanged in CUDA graphs.

Triton ships with torch's CUDA builds; it is imported only when a CUDA engine first needs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, scale,
    stride_q_tok, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_table,
    stride_o_tok, stride_o_head,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TOKENS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    ctx = tl.load(lens_ptr + seq)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows
    row_ok = rows < GROUP
    q = tl.load(
        q_ptr + seq * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    offs = tl.arange(0, TOKENS)
    for start in range(0, ctx, TOKENS):
        pos = start + offs
        valid = pos < ctx
        block = tl.load(tables_ptr + seq * stride_table + pos // BLOCK_SIZE, mask=valid, other=0)
        base = (
            block.to(tl.int64) * stride_k_block + (pos % BLOCK_SIZE) * stride_k_slot + kv_head * stride_k_head
        )
        k = tl.load(k_ptr + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + seq * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    tokens_per_iter: int = 64,
) -> torch.Tensor:
    """q [B, heads, D]; caches [blocks, block_size, kv_heads, D]; tables [B, W]; lens [B] -> [B, heads, D]."""
    batch, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    _paged_decode_kernel[(batch, kv_heads)](
        q, k_cache, v_cache, out, block_tables, context_lens, scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=dim,
        BLOCK_SIZE=block_size, TOKENS=max(tokens_per_iter, block_size),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # float32 stays exact; bf16 ignores it
    )  # fmt: skip
    return out
