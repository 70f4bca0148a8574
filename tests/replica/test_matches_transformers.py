"""Greedy outputs equal transformers' generate, token for token, under continuous batching."""

from __future__ import annotations

import asyncio

import pytest

from replica import Engine, EngineConfig, SamplingParams
from tests.replica.conftest import hf_greedy

MAX_TOKENS = [24, 8, 40, 16, 32, 12, 48, 20, 8, 36, 16, 28, 12, 44, 24, 32]


@pytest.fixture(scope="module")
def references(hf_model, tokenizer, mixed_prompts):
    eos = tokenizer.eos_token_id
    return [hf_greedy(hf_model, p, m, eos) for p, m in zip(mixed_prompts, MAX_TOKENS, strict=True)]


async def _run_staggered(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    async def one(i: int) -> list[int]:
        await asyncio.sleep(0.03 * (i % 6))  # staggered arrivals: requests join a running batch
        tokens: list[int] = []
        params = SamplingParams(max_tokens=MAX_TOKENS[i], temperature=0.0)
        async for out in engine.generate(prompts[i], params, request_id=f"r{i}"):
            tokens.extend(out.token_ids)
        return tokens

    return await asyncio.gather(*(one(i) for i in range(len(prompts))))


@pytest.mark.parametrize(
    ("mode", "num_kv_blocks", "budget"),
    [
        ("async", None, 256),
        ("sync", None, 256),
        # 40 blocks x 16 = 640 tokens for ~4,000 tokens of demand: forces preemption and recompute.
        ("async", 41, 128),
        ("sync", 41, 128),
    ],
)
async def test_greedy_equals_transformers(mode, num_kv_blocks, budget, mixed_prompts, references):
    config = EngineConfig(
        model="smollm2-135m",
        device="cpu",
        mode=mode,
        num_kv_blocks=num_kv_blocks,
        max_num_batched_tokens=budget,
    )
    engine = Engine(config)
    await engine.start()
    try:
        outputs = await _run_staggered(engine, mixed_prompts)
        stats = engine.stats()
    finally:
        await engine.stop()
    for i, (ours, ref) in enumerate(zip(outputs, references, strict=True)):
        assert ours == ref, f"request {i} ({len(mixed_prompts[i])} prompt tokens) differs"
    assert stats.kv_blocks_used == 0
    assert stats.running == 0 and stats.waiting == 0
    if num_kv_blocks is not None:
        assert stats.num_preemptions > 0, "the small cache was meant to force preemption"
