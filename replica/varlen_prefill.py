"""Every prefill chunk of a step in one flash-attention call (CUDA, bf16/fp16).

The reference in `attention.py` calls SDPA once per chunk per layer. A SmolLM2 prefill step of eight
256-token prompts is then 8 × 30 small attention calls plus their copies, and the step is bound by
kernel launches from Python (45–57 ms for 2,048 tokens). Flash attention's variable-length form
takes all chunks at once: queries and keys packed back to back, `cu_seq_q` / `cu_seq_k` marking
where each sequence starts. Grouped-query heads are read in place (the kernel maps each query head
to its KV head), and a causal mask with more keys than queries is aligned to the bottom-right
corner: query i of a chunk at the end of a longer context sees the keys up to its own position,
which is what a continued (chunked) prompt needs.

Keys of a chunk that is its sequence's whole context are this step's new keys (no cache read); a
chunk that continues a sequence reads its earlier keys from the paged cache (one gather per such
chunk, as the reference does). An FP8 cache's gathered keys and values are dequantised to the
query's dtype first (replica/kv_quant.py): flash attention reads bf16/fp16 only. The step's own
keys come in as the cache holds them: `attention.paged_attention` rounds them through e4m3 first.
"""

from __future__ import annotations

import torch

from replica.attention_metadata import AttentionMetadata, PrefillChunk
from replica.kv_quant import UNIT_SCALES, KVScales, gather, gather_slots

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def flash_varlen_available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether this torch build, GPU and shape can take the varlen flash path."""
    if device.type != "cuda" or dtype not in FLASH_DTYPES or head_dim % 8 or head_dim > 256:
        return False
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def varlen_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    kv_scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """Attention of the prefill rows q[num_decode:] ([rows, heads, D]); k, v hold the step's new keys."""
    nd = meta.num_decode
    keys, values = _packed_keys(k, v, kv_cache, meta, kv_scales)
    out = torch.ops.aten._flash_attention_forward(
        q[nd:],
        keys,
        values,
        meta.prefill_cu_q,
        meta.prefill_cu_k,
        meta.prefill_max_q,
        meta.prefill_max_k,
        0.0,  # dropout
        True,  # causal, bottom-right aligned
        False,  # no debug mask
        scale=scale,
    )[0]
    return out


def padded_mixed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    kv_scales: KVScales = UNIT_SCALES,
) -> torch.Tensor:
    """A mixed step in fixed shapes (what a mixed CUDA graph captures; see mixed_graphs.py).

    When every chunk starts its sequence, its keys are the step's own rows. Otherwise each chunk's
    whole context is gathered from the cache (`meta.prefill_key_slots`, a fixed count: the graph's
    context rung; the step's new keys are already written) and packed at `prefill_cu_k`. The query
    offsets in the buffer count from the first prompt row; adding the device-side decode count makes
    them offsets into the whole step. The paged decode kernel runs over `meta.num_decode` rows (the
    padded row count) and its output is kept for the rows below `meta.decode_rows`.
    """
    from replica.triton_decode import paged_decode_attention

    offsets = meta.prefill_cu_q + meta.decode_rows
    keys, values, key_offsets = k, v, offsets
    if meta.prefill_key_slots is not None:
        slots = meta.prefill_key_slots
        keys = gather_slots(kv_cache[0], slots, kv_scales.k, q.dtype)
        values = gather_slots(kv_cache[1], slots, kv_scales.v, q.dtype)
        key_offsets = meta.prefill_cu_k
    out = torch.ops.aten._flash_attention_forward(
        q, keys, values, offsets, key_offsets, meta.prefill_max_q, meta.prefill_max_k, 0.0, True, False,
        scale=scale,
    )[0]  # fmt: skip
    rows = meta.num_decode
    decoded = paged_decode_attention(
        q[:rows],
        kv_cache[0],
        kv_cache[1],
        meta.decode_block_tables,
        meta.decode_context_lens,
        scale,
        **meta.decode_kernel.launch_args(),
        kv_scales=kv_scales,
    )
    is_decode = torch.arange(rows, device=q.device, dtype=meta.decode_rows.dtype) < meta.decode_rows
    out[:rows] = torch.where(is_decode[:, None, None], decoded, out[:rows])
    return out


def _packed_keys(
    k, v, kv_cache, meta: AttentionMetadata, kv_scales: KVScales
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's keys back to back, in the order of its queries."""
    nd = meta.num_decode
    if all(c.context_len == c.q_len for c in meta.prefills):
        return k[nd:], v[nd:]
    key_parts, value_parts = [], []
    for chunk in meta.prefills:
        if chunk.context_len == chunk.q_len:
            rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
            key_parts.append(k[rows])
            value_parts.append(v[rows])
        else:
            key_parts.append(_cached(kv_cache[0], chunk, kv_scales.k, k.dtype))
            value_parts.append(_cached(kv_cache[1], chunk, kv_scales.v, v.dtype))
    return torch.cat(key_parts), torch.cat(value_parts)


def _cached(cache: torch.Tensor, chunk: PrefillChunk, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The chunk's whole context ([context_len, kv_heads, D]), its new keys included (already written)."""
    block_size = cache.shape[1]
    table = chunk.block_table[: -(-chunk.context_len // block_size)]
    return gather(cache, table, scale, dtype).flatten(0, 1)[: chunk.context_len]
