"""The one-call flash prefill equals the per-chunk reference (skipped without CUDA).

Run on the GPU machine: python -m pytest tests/gpu -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import itertools

import pytest
import torch

from replica.attention import AttentionMetadata, PrefillChunk, paged_attention, write_kv
from replica.varlen_prefill import flash_varlen_available

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BLOCK = 16


def _step(heads: int, kv_heads: int, dim: int, dtype: torch.dtype, chunks: list, decodes: int):
    """A step of `decodes` decode rows then chunks (q_len, context_len); earlier context pre-filled."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    num_blocks = 256
    k_cache = torch.randn(num_blocks, BLOCK, kv_heads, dim, device=dev, dtype=dtype, generator=gen)
    v_cache = torch.randn_like(k_cache)
    free = iter(torch.randperm(num_blocks - 1, device="cpu", generator=torch.Generator().manual_seed(1)) + 1)
    tables, slots = [], []
    for _ in range(decodes):  # decode rows: context of 40, new token at position 39
        table = torch.tensor([next(free) for _ in range(3)], device=dev)
        tables.append(table)
        slots.append(table[39 // BLOCK] * BLOCK + 39 % BLOCK)
    prefills, row = [], decodes
    for q_len, ctx in chunks:
        table = torch.tensor([next(free) for _ in range(-(-ctx // BLOCK))], device=dev)
        pos = torch.arange(ctx - q_len, ctx, device=dev)
        slots.extend(table[pos // BLOCK] * BLOCK + pos % BLOCK)
        prefills.append(PrefillChunk(row, q_len, ctx, table))
        row += q_len
    tokens = row
    q = torch.randn(tokens, heads, dim, device=dev, dtype=dtype, generator=gen)
    k = torch.randn(tokens, kv_heads, dim, device=dev, dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    slot_mapping = torch.stack([torch.as_tensor(s, device=dev) for s in slots])
    write_kv(k_cache, v_cache, slot_mapping, k, v)
    width = max([3] + [len(c.block_table) for c in prefills])
    decode_tables = torch.zeros(max(decodes, 1), width, dtype=torch.int64, device=dev)
    for i, t in enumerate(tables):
        decode_tables[i, : len(t)] = t
    cu_q = torch.tensor([0, *itertools.accumulate(c[0] for c in chunks)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(c[1] for c in chunks)], dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping, num_decode=decodes, decode_block_tables=decode_tables[:decodes],
        decode_context_lens=torch.full((decodes,), 40, device=dev), prefills=prefills,
        prefill_cu_q=cu_q.to(dev), prefill_cu_k=cu_k.to(dev),
        prefill_max_q=max(c[0] for c in chunks), prefill_max_k=max(c[1] for c in chunks),
    )  # fmt: skip
    return q, k, v, (k_cache, v_cache), meta


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (32, 8, 128), (8, 8, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "chunks,decodes",
    [
        ([(256, 256)] * 8, 0),  # a batch of whole prompts: keys are the step's own
        ([(100, 100), (64, 300), (7, 7), (33, 97)], 0),  # continued prompts read the cache
        ([(50, 50), (128, 200)], 5),  # decode rows first, then chunks
    ],
)
def test_flash_prefill_equals_the_reference(heads, kv_heads, dim, dtype, chunks, decodes):
    assert flash_varlen_available(torch.device("cuda"), dtype, dim)
    q, k, v, cache, meta = _step(heads, kv_heads, dim, dtype, chunks, decodes)
    scale = dim**-0.5
    want = paged_attention(q, k, v, cache, meta, scale)
    meta.prefill_backend = "flash"
    got = paged_attention(q, k, v, cache, meta, scale)
    assert got.shape == want.shape
    err = (got.float() - want.float()).abs().max().item()
    assert err < 2e-2, f"max abs error {err}"


@pytest.mark.parametrize("dtype,backend", [("bfloat16", "flash"), ("float32", "torch")])
def test_engine_picks_flash_prefill_where_the_kernel_runs(dtype, backend):
    import asyncio

    from replica import Engine, EngineConfig

    async def backend_of_a_started_engine() -> str:
        engine = Engine(EngineConfig(model="smollm2-135m", random_weights=True, device="cuda", dtype=dtype))
        await engine.start()
        try:
            return engine.core.runner.prefill_backend
        finally:
            await engine.stop()

    assert asyncio.run(backend_of_a_started_engine()) == backend
    assert not flash_varlen_available(torch.device("cpu"), torch.bfloat16, 64)
