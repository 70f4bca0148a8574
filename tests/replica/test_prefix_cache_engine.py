"""Prefix caching through the engine (real SmolLM2 on the CPU): a repeated prefix is found, its
answers equal an engine without caching token for token (chunked prefill, n > 1, preemption),
scopes never share, and a small cache evicts least recently freed blocks first."""

from __future__ import annotations

import asyncio

import pytest

from replica import Engine, EngineConfig, SamplingParams
from tests.replica.corpus import long_text

BLOCK = 16


async def _run(
    engine: Engine, prompt: list[int], params: SamplingParams, scope: str = "t"
) -> tuple[dict, int]:
    """Each sample's tokens by index, and the request's cached prompt tokens (every sample's figure)."""
    tokens: dict[int, list[int]] = {}
    cached = set()
    async for out in engine.generate(prompt, params, cache_scope=scope):
        tokens.setdefault(out.index, []).extend(out.token_ids)
        cached.add(out.num_cached_tokens)
    assert len(cached) == 1, cached
    return tokens, cached.pop()


def _engine(**kwargs) -> Engine:
    return Engine(EngineConfig(model="smollm2-135m", device="cpu", **{"mode": "async"} | kwargs))


@pytest.fixture(scope="module")
async def engines():
    """Caching on with chunked prefill (64-token steps), and off with whole prompts: the reference."""
    on, off = (
        _engine(max_num_batched_tokens=64),
        _engine(max_num_batched_tokens=512, enable_prefix_caching=False),
    )
    await on.start()
    await off.start()
    yield on, off
    await on.stop()
    await off.stop()


@pytest.fixture(scope="module")
def text_ids(tokenizer) -> list[int]:
    return tokenizer.encode(long_text(), add_special_tokens=False)


GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


async def test_second_request_hits_its_full_blocks_and_answers_the_same(engines, text_ids):
    on, off = engines
    prompt = text_ids[10:310]
    reference, cached = await _run(off, prompt, GREEDY)
    assert cached == 0
    first, cached = await _run(on, prompt, GREEDY)
    assert cached == 0 and first == reference
    second, cached = await _run(on, prompt, GREEDY)
    assert cached == (len(prompt) - 1) // BLOCK * BLOCK == 288 and second == reference
    # A prompt that shares 200 tokens, then goes its own way: the shared prefix's full blocks hit.
    fork = [*prompt[:200], *text_ids[600:700]]
    reference, _ = await _run(off, fork, GREEDY)
    tokens, cached = await _run(on, fork, GREEDY)
    assert cached == 200 // BLOCK * BLOCK and tokens == reference
    stats = on.stats()
    assert stats.cached_prompt_tokens == 288 + 192 and stats.prompt_tokens == 3 * 300
    assert stats.kv_blocks_cached > 0 and stats.kv_blocks_used == 0  # found blocks stay only while free


async def test_the_whole_prompt_cached_still_computes_its_last_token(engines, text_ids):
    on, off = engines
    prompt = text_ids[1000 : 1000 + 4 * BLOCK]  # block-aligned: its last block is computed again
    reference, _ = await _run(off, prompt, GREEDY)
    await _run(on, prompt, GREEDY)
    tokens, cached = await _run(on, prompt, GREEDY)
    assert cached == 3 * BLOCK and tokens == reference


async def test_scopes_never_share_blocks(engines, text_ids):
    on, _ = engines
    prompt = text_ids[400:560]
    _, cached = await _run(on, prompt, GREEDY, scope="tenant-a")
    assert cached == 0
    _, cached = await _run(on, prompt, GREEDY, scope="tenant-b")
    assert cached == 0  # another tenant sending the same prompt
    _, cached = await _run(on, prompt, GREEDY, scope='["tenant-a", "salt-1"]')
    assert cached == 0  # the same tenant with a cache_salt
    _, cached = await _run(on, prompt, GREEDY, scope="tenant-a")
    assert cached == 144
    _, cached = await _run(on, prompt, GREEDY, scope='["tenant-a", "salt-1"]')
    assert cached == 144


async def test_parallel_samples_share_a_cached_prompt(engines, text_ids):
    on, off = engines
    prompt = text_ids[1100:1250]
    for params in (
        SamplingParams(max_tokens=12, temperature=0.0, n=3, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=7, n=3, ignore_eos=True),
    ):
        reference, _ = await _run(off, prompt, params)
        await _run(on, prompt, params, scope="n")
        tokens, cached = await _run(on, prompt, params, scope="n")
        assert cached == 144 and tokens == reference
        assert len(tokens) == 3


async def test_preempted_requests_answer_the_same_with_cached_prefixes(engines, text_ids):
    _, off = engines
    small = _engine(num_kv_blocks=25, max_num_batched_tokens=64)  # 24 blocks: the batch preempts
    await small.start()
    try:
        system = text_ids[1300:1364]  # a shared 64-token start, then each its own question
        prompts = [[*system, *text_ids[1400 + 40 * i : 1430 + 40 * i]] for i in range(6)]
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        reference = [(await _run(off, p, params))[0] for p in prompts]
        for round_ in range(2):
            before = small.stats().num_preemptions
            results = await asyncio.gather(*(_run(small, p, params) for p in prompts))
            assert [r[0] for r in results] == reference, f"round {round_}"
            assert small.stats().num_preemptions > before, "the test needs preemption"
            assert small.stats().kv_blocks_used == 0
        assert small.stats().cached_prompt_tokens >= 5 * 64  # the shared start, at least
    finally:
        await small.stop()


async def test_small_cache_evicts_least_recently_freed_first(text_ids):
    small = _engine(num_kv_blocks=25, max_num_batched_tokens=64)  # 24 usable blocks
    await small.start()
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        a, b, c, d = (text_ids[500 * i : 500 * i + 120] for i in range(4))  # 8 blocks each, 7 kept
        for prompt in (a, b, c):
            await _run(small, prompt, params)
        assert small.stats().kv_evictions == 0  # 3 × 8 blocks fit: nothing had to go
        await _run(small, d, params)  # needs 8: the 3 plain free blocks, then a's oldest 5
        assert small.stats().kv_evictions == 5
        _, cached = await _run(small, c, params)
        assert cached == 112  # freed after a and b: still there
        _, cached = await _run(small, a, params)
        assert cached == 0  # freed first: evicted first
    finally:
        await small.stop()


async def test_waiting_tokens_count_the_uncached_prompt_and_the_answer_budget(engines, text_ids):
    """What a replica reports as queued work (routing's ``waiting_tokens``) is in the routers' units:
    a request whose prompt is mostly cached adds only its uncached tail and its answer budget, and
    its share goes away once it produces. It used to add the whole prompt, so the replica holding a
    conversation looked busiest exactly when the conversation's next turns would hit its cache."""
    on, off = engines
    prompt = text_ids[400:720]  # 320 tokens, 20 full blocks
    await _run(on, prompt, GREEDY)  # now cached, short of the last token's block
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=2)
    seen = []
    for engine in (on, off):
        stream = engine.generate([*prompt, 42], params, cache_scope="t")
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # the request is admitted and counted before its first output
        seen.append(engine.waiting_tokens)
        await first
        assert engine.waiting_tokens == 0
        async for _ in stream:
            pass
    cached_blocks = (len(prompt) + 1 - 1) // BLOCK
    assert seen == [len(prompt) + 1 - cached_blocks * BLOCK + 8 * 2, len(prompt) + 1 + 8 * 2]
