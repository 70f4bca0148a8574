"""Paged attention over the block-table KV cache: the plain torch reference.

The cache of one layer is two tensors [num_blocks, block_size, kv_heads, head_dim]. A step's tokens
are flattened: the decode rows (one query each) come first, then each prefill chunk. This reference
gathers a sequence's blocks into a contiguous view before calling SDPA; faster backends for CUDA
read the blocks in place and must give the same result (tests compare them against this one).

An FP8 cache (replica/kv_quant.py) holds e4m3 with one scale per layer for K and for V (`kv_scales`):
writes quantise, reads dequantise what they gather to the query's dtype before the same SDPA call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replica.attention_metadata import AttentionMetadata, PrefillChunk
from replica.kv_quant import UNIT_SCALES, KVScales, as_read, gather, store


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_scales: KVScales = UNIT_SCALES,
) -> None:
    """Store the new tokens' keys and values at their slots (quantised if the cache is FP8)."""
    store(k_cache, slots, k, kv_scales.k)
    store(v_cache, slots, v, kv_scales.v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    kv_scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """Attention for every row of q [num_tokens, heads, head_dim].

    k and v are this step's new keys and values (already written to the cache): a chunk that is a
    sequence's whole context attends to them directly instead of reading the cache back. With an FP8
    cache they are first rounded through e4m3 (`as_read`), here for every path: a graphed mixed step
    gathers them back from the cache, and eager steps must see the same values.
    """
    k_cache, v_cache = kv_cache
    nd = meta.num_decode
    if nd < q.shape[0]:  # prompt rows (a pure decode step reads only the cache)
        k, v = as_read(k, k_cache, kv_scales.k), as_read(v, v_cache, kv_scales.v)
    if meta.prefill_backend == "flash_padded":
        from replica.varlen_prefill import padded_mixed_attention

        return padded_mixed_attention(q, k, v, kv_cache, meta, scale, kv_scales)
    if nd == q.shape[0] and meta.decode_backend == "triton":
        return _triton_decode(q, k_cache, v_cache, meta, scale, kv_scales)  # pure decode: no extra copy
    flash = bool(meta.prefills) and meta.prefill_backend == "flash"
    if flash and not nd:
        return _flash_prefill(q, k, v, kv_cache, meta, scale, kv_scales)  # pure prefill: no extra copy
    out = torch.empty_like(q)
    if nd:
        if meta.decode_backend == "triton":
            out[:nd] = _triton_decode(q[:nd], k_cache, v_cache, meta, scale, kv_scales)
        else:
            out[:nd] = decode_attention(
                q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale, kv_scales
            )
    if flash:
        out[nd:] = _flash_prefill(q, k, v, kv_cache, meta, scale, kv_scales)
        return out
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        if chunk.context_len == chunk.q_len:  # the step's own keys (as_read above)
            out[rows] = causal_attention(q[rows], k[rows], v[rows], scale)
        else:
            out[rows] = prefill_attention(q[rows], k_cache, v_cache, chunk, scale, kv_scales)
    return out


def _flash_prefill(q, k, v, kv_cache, meta: AttentionMetadata, scale: float, kv_scales: KVScales):
    from replica.varlen_prefill import varlen_prefill_attention

    return varlen_prefill_attention(q, k, v, kv_cache, meta, scale, kv_scales)


def fuses_rope_into_decode(meta: AttentionMetadata, rows: int) -> bool:
    """Whether a step is pure decode on the Triton kernel with rope inside (`fused_rope_decode`)."""
    triton = meta.decode_backend == "triton" and meta.decode_kernel.rope
    return triton and meta.prefill_backend != "flash_padded" and meta.num_decode == rows


def fused_rope_decode(
    qkv, positions, rope_table, kv_cache, meta: AttentionMetadata, heads: int, scale: float,
    kv_scales: KVScales = UNIT_SCALES,
):  # fmt: skip
    """Pure decode on CUDA: rotary embedding, the cache write and attention in one Triton kernel."""
    from replica.triton_decode import paged_decode_attention

    rows, head_dim = qkv.shape[0], kv_cache[0].shape[-1]
    q = qkv[:, : heads * head_dim].view(rows, heads, head_dim)
    return paged_decode_attention(
        q, kv_cache[0], kv_cache[1], meta.decode_block_tables, meta.decode_context_lens, scale,
        **meta.decode_kernel.launch_args(),
        rope=(positions, rope_table, meta.slot_mapping), kv_scales=kv_scales,
    )  # fmt: skip


def _triton_decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, kv_scales: KVScales):
    from replica.triton_decode import paged_decode_attention

    return paged_decode_attention(
        q,
        k_cache,
        v_cache,
        meta.decode_block_tables,
        meta.decode_context_lens,
        scale,
        **meta.decode_kernel.launch_args(),
        kv_scales=kv_scales,
    )


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, D] -> [1, heads, tokens, D]: SDPA's fused (flash / memory-efficient) kernels
    take 4-D inputs only; a 3-D call silently falls back to the float32 math path, which builds the
    causal mask and the score matrix in memory, one kernel launch after another."""
    return x.transpose(0, 1).unsqueeze(0)


def _expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[tokens, kv_heads, D] -> [tokens, heads, D]. Fused SDPA kernels differ by torch release in
    whether they take grouped heads; expanded heads run on all of them, for one copy of the chunk."""
    groups = heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A whole sequence in one chunk: plain causal attention over its own new keys and values."""
    heads = q.shape[1]
    k, v = _expand_heads(k, heads), _expand_heads(v, heads)
    out = F.scaled_dot_product_attention(
        _heads_first(q), _heads_first(k.to(q.dtype)), _heads_first(v.to(q.dtype)), is_causal=True, scale=scale
    )
    return out[0].transpose(0, 1)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    kv_scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """One query per sequence, batched: gather each sequence's blocks, mask the padding."""
    batch = q.shape[0]
    k_blocks = gather(k_cache, block_tables, kv_scales.k, q.dtype)  # [B, W, block_size, kv_heads, D]
    keys = k_blocks.flatten(1, 2).transpose(1, 2)  # [B, kv_heads, L, D]
    values = gather(v_cache, block_tables, kv_scales.v, q.dtype).flatten(1, 2).transpose(1, 2)
    length = keys.shape[2]
    visible = torch.arange(length, device=q.device)[None, :] < context_lens[:, None]  # [B, L]
    out = F.scaled_dot_product_attention(
        q.view(batch, -1, 1, q.shape[-1]).to(keys.dtype),
        keys,
        values,
        attn_mask=visible[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out.view(batch, -1, q.shape[-1]).to(q.dtype)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
    kv_scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """A chunk of queries of one sequence attending causally to its whole context."""
    ctx, q_len = chunk.context_len, chunk.q_len
    block_size = k_cache.shape[1]
    table = chunk.block_table[: -(-ctx // block_size)]
    heads = q.shape[1]
    k_ctx = gather(k_cache, table, kv_scales.k, q.dtype).flatten(0, 1)[:ctx]
    v_ctx = gather(v_cache, table, kv_scales.v, q.dtype).flatten(0, 1)[:ctx]
    keys = _heads_first(_expand_heads(k_ctx, heads))
    values = _heads_first(_expand_heads(v_ctx, heads))
    queries = _heads_first(q.to(keys.dtype))  # [1, heads, q_len, D]
    # Query i sits at position ctx - q_len + i and sees every key up to it. (A chunk that is the
    # whole context takes `causal_attention` instead: no cache read needed.)
    query_pos = torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
    mask = torch.arange(ctx, device=q.device)[None, :] <= query_pos
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1).to(q.dtype)
