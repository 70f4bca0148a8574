"""The one-call flash prefill equals the per-chunk reference (skipped without CUDA).

Run on the GPU machine: python -m pytest tests/gpu -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import itertools

import pytest
import torch

from replica.attention import paged_attention, write_kv
from replica.attention_metadata import AttentionMetadata, PrefillChunk
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


def _padded_bounds(bounds: torch.Tensor) -> torch.Tensor:
    """Chunk offsets as a mixed graph's IO buffer holds them: MAX_CHUNKS + 1, the last repeated."""
    from replica.mixed_graphs import MAX_CHUNKS

    values = bounds.tolist()
    return torch.tensor(
        values + [values[-1]] * (MAX_CHUNKS + 1 - len(values)), dtype=torch.int32, device="cuda"
    )


def _fixed_shape(meta, rows: int, decodes: int, tokens: int, cu_k, max_k: int, key_slots=None):
    """`meta` in a mixed graph's fixed shapes: `rows` decode rows (padded ones read block 0 only)."""
    tables = torch.zeros(rows, meta.decode_block_tables.shape[1], dtype=torch.int64, device="cuda")
    tables[:decodes] = meta.decode_block_tables
    lens = torch.ones(rows, dtype=torch.int64, device="cuda")
    lens[:decodes] = meta.decode_context_lens
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping, num_decode=rows, decode_block_tables=tables, decode_context_lens=lens,
        prefills=[], decode_backend="triton", prefill_backend="flash_padded",
        prefill_cu_q=_padded_bounds(meta.prefill_cu_q), prefill_cu_k=cu_k, prefill_max_q=tokens,
        prefill_max_k=max_k, decode_rows=torch.tensor([decodes], dtype=torch.int32, device="cuda"),
        prefill_key_slots=key_slots,
    )  # fmt: skip


def test_padded_mixed_step_equals_the_reference():
    """The fixed-shape form a mixed CUDA graph runs: padded tokens, padded decode rows, padded chunks."""
    from replica.varlen_prefill import padded_mixed_attention

    chunks, decodes = [(50, 50), (128, 128), (7, 7)], 5
    q, k, v, cache, meta = _step(9, 3, 64, torch.bfloat16, chunks, decodes)
    want = paged_attention(q, k, v, cache, meta, 64**-0.5)  # the per-chunk reference
    tokens, rows = 256, 32
    used = q.shape[0]

    def padded(x: torch.Tensor) -> torch.Tensor:  # garbage in the padding: it must not leak
        return torch.cat([x, torch.full((tokens - used, *x.shape[1:]), 7.0, dtype=x.dtype, device=x.device)])

    bounds = _padded_bounds(meta.prefill_cu_q)
    fixed = _fixed_shape(meta, rows, decodes, tokens, bounds, tokens)
    got = padded_mixed_attention(padded(q), padded(k), padded(v), cache, fixed, 64**-0.5)[:used]
    err = (got.float() - want.float()).abs().max().item()
    assert err < 2e-2, f"max abs error {err}"


def test_mixed_graphs_run_mixed_steps_and_agree_with_eager_steps():
    """Staggered arrivals make steps that mix decodes with new prompts: graphs run them.

    Against eager steps the padded GEMMs see other row counts, so bf16 rounding may flip near-ties
    of the random weights (and a flip changes the rest of that sequence): most sequences must agree
    in full, which a wrong row, offset or padding leak would break in every sequence. Exact equality on the
    same batches is `test_bf16_async_equals_sync_on_the_same_batches` (graphs on by default).
    """
    import asyncio

    from replica import Engine, EngineConfig, SamplingParams

    rng = torch.Generator().manual_seed(11)
    lengths = (40, 90, 17, 200, 64, 33)
    prompts = [torch.randint(100, 49000, (n,), generator=rng).tolist() for n in lengths]
    max_tokens = 24

    async def run(**overrides) -> tuple[list[list[int]], int]:
        cfg = EngineConfig(
            model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=16,
            max_num_batched_tokens=256, **overrides,
        )  # fmt: skip
        engine = Engine(cfg)
        await engine.start()
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

            async def one(i: int) -> list[int]:
                await asyncio.sleep(0.003 * i)  # arrive while earlier requests decode
                outs = [o async for o in engine.generate(prompts[i], params)]
                return [t for out in outs for t in out.token_ids]

            outputs = await asyncio.gather(*(one(i) for i in range(len(prompts))))
            return outputs, engine.core.runner.mixed_replays
        finally:
            await engine.stop()

    graphed, replays = asyncio.run(run())
    eager, no_replays = asyncio.run(run(mixed_cuda_graphs=False))
    assert replays > 0 and no_replays == 0
    assert all(len(o) == max_tokens for o in graphed)
    agree = sum(g == e for g, e in zip(graphed, eager, strict=True))
    assert agree >= len(prompts) // 2, (graphed, eager)


def test_context_graph_attention_equals_the_reference():
    """A context graph's fixed-shape step: chunks that continue their sequences (and one that starts
    its own) read every key through slots derived on the device from cu_k and the block tables."""
    from replica.mixed_graphs import MAX_CHUNKS, key_slots
    from replica.varlen_prefill import padded_mixed_attention

    chunks, decodes = [(30, 300), (128, 128), (5, 900), (1, 64)], 3
    q, k, v, cache, meta = _step(8, 2, 64, torch.bfloat16, chunks, decodes)
    want = paged_attention(q, k, v, cache, meta, 64**-0.5)
    tokens, rows, keys = 256, 32, 2048  # padded: tokens, decode rows and gathered keys
    used = q.shape[0]

    def padded(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.full((tokens - used, *x.shape[1:]), 7.0, dtype=x.dtype, device=x.device)])

    width = 64
    dev = {
        "prefill_tables": torch.zeros(rows, width, dtype=torch.int64, device="cuda"),
        "prefill_cu_k": torch.zeros(MAX_CHUNKS + 1, dtype=torch.int32, device="cuda"),
    }
    for i, c in enumerate(meta.prefills):
        dev["prefill_tables"][i, : len(c.block_table)] = c.block_table
        dev["prefill_tables"][i, len(c.block_table) :] = 9  # stale entries past the table: never read
    dev["prefill_cu_k"][:] = _padded_bounds(meta.prefill_cu_k)
    slots = key_slots(dev, keys, BLOCK)
    expected = []
    for c in meta.prefills:  # each chunk's first context_len slots, in order
        within = torch.arange(len(c.block_table) * BLOCK, device="cuda")
        expected.append((c.block_table[within // BLOCK] * BLOCK + within % BLOCK)[: c.context_len])
    expected = torch.cat(expected)
    assert torch.equal(slots[: len(expected)], expected) and not slots[len(expected) :].any()

    fixed = _fixed_shape(meta, rows, decodes, tokens, dev["prefill_cu_k"], keys, slots)
    got = padded_mixed_attention(padded(q), padded(k), padded(v), cache, fixed, 64**-0.5)[:used]
    err = (got.float() - want.float()).abs().max().item()
    assert err < 2e-2, f"max abs error {err}"


def test_cached_prefixes_run_context_graphs_and_agree_with_eager_steps():
    """Prompts that share a cached prefix with an earlier one (and long prompts chunked over several
    steps) continue their sequences: context graphs run those steps, with the tokens of eager ones."""
    import asyncio

    from replica import Engine, EngineConfig, SamplingParams

    rng = torch.Generator().manual_seed(5)
    system = torch.randint(100, 49000, (600,), generator=rng).tolist()
    prompts = [system + torch.randint(100, 49000, (n,), generator=rng).tolist() for n in (20, 45, 9, 70)]
    prompts.append(torch.randint(100, 49000, (700,), generator=rng).tolist())  # chunked: 256 per step
    max_tokens = 16

    async def run(**overrides) -> tuple[list[list[int]], int, int]:
        cfg = EngineConfig(
            model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=16,
            max_num_batched_tokens=256, **overrides,
        )  # fmt: skip
        engine = Engine(cfg)
        await engine.start()
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

            async def one(prompt: list[int], delay: float) -> list[int]:
                await asyncio.sleep(delay)
                outs = [o async for o in engine.generate(prompt, params)]
                return [t for out in outs for t in out.token_ids]

            first = await one(prompts[0], 0.0)  # caches the system prompt
            rest = await asyncio.gather(*(one(p, 0.003 * i) for i, p in enumerate(prompts[1:])))
            runner = engine.core.runner
            context = runner.mixed.context_replays
            return [first, *rest], context, runner.mixed_replays
        finally:
            await engine.stop()

    graphed, context, _ = asyncio.run(run(context_cuda_graphs=True))
    eager, no_context, no_replays = asyncio.run(run(mixed_cuda_graphs=False))
    assert context > 0 and no_context == 0 and no_replays == 0
    assert all(len(o) == max_tokens for o in graphed)
    agree = sum(g == e for g, e in zip(graphed, eager, strict=True))
    assert agree >= len(prompts) // 2 + 1, (graphed, eager)
