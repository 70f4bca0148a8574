"""Sampling through the engine: seeds, penalties, bias, min_tokens, logprobs and n > 1, checked
against transformers on the same model (float32 on the CPU: tokens equal exactly)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from replica import Engine, EngineConfig, SamplingParams
from tests.replica.conftest import collect

PROMPT_TEXT = "Write a short poem about the sea."


@pytest.fixture(scope="module")
async def small_cache_engine():
    """An engine whose cache holds a fraction of what concurrent requests need: it preempts."""
    eng = Engine(
        EngineConfig(
            model="smollm2-135m", device="cpu", mode="async", num_kv_blocks=25, max_num_batched_tokens=64
        )
    )
    await eng.start()
    yield eng
    await eng.stop()


def _chat(tokenizer, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(chat, add_special_tokens=False)


def hf_generate(hf_model, prompt: list[int], max_tokens: int, eos: int, **kwargs) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
            eos_token_id=eos, pad_token_id=eos, **kwargs,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


async def test_same_seed_same_output_under_any_batch(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT_TEXT}])
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    alone, _, _ = await collect(engine, prompt, params)
    noise = [
        collect(engine, prompt, SamplingParams(max_tokens=24, temperature=1.0, min_p=0.05, seed=i))
        for i in range(6)
    ]
    results = await asyncio.gather(collect(engine, prompt, params), *noise)
    assert results[0][0] == alone
    others = {tuple(r[0]) for r in results[1:]}
    assert len(others) > 1, "different seeds should give different samples"


async def test_same_seed_same_output_after_preemption(engine, small_cache_engine, mixed_prompts):
    """The small-cache engine preempts and recomputes; each seeded request still draws the same tokens."""
    params = [
        SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=100 + i, ignore_eos=True,
                       repetition_penalty=1.1 if i % 2 else 1.0, frequency_penalty=0.3 if i % 3 else 0.0)
        for i in range(6)
    ]  # fmt: skip
    prompts = [mixed_prompts[i] for i in (2, 3, 4, 8, 9, 14)]
    calm = [(await collect(engine, p, q))[0] for p, q in zip(prompts, params, strict=True)]
    before = small_cache_engine.stats().num_preemptions
    crowded = await asyncio.gather(
        *(collect(small_cache_engine, p, q) for p, q in zip(prompts, params, strict=True))
    )
    assert small_cache_engine.stats().num_preemptions > before
    assert [c[0] for c in crowded] == calm
    assert small_cache_engine.stats().kv_blocks_used == 0


async def test_top_k_one_is_greedy(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT_TEXT}])
    greedy, _, _ = await collect(engine, prompt, SamplingParams(max_tokens=16, temperature=0.0))
    top1, _, _ = await collect(
        engine, prompt, SamplingParams(max_tokens=16, temperature=1.5, top_k=1, seed=5)
    )
    assert top1 == greedy


async def test_repetition_penalty_and_logit_bias_equal_transformers(
    engine, small_cache_engine, hf_model, tokenizer, mixed_prompts
):
    eos = tokenizer.eos_token_id
    prompts = [mixed_prompts[0], mixed_prompts[3], mixed_prompts[9]]
    banned = hf_generate(hf_model, prompts[1], 1, eos)[0]  # the greedy first token, pushed away
    cases = [
        ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}),
        ({"repetition_penalty": 0.7}, {"repetition_penalty": 0.7}),
        ({"logit_bias": {banned: -100.0, 28: 3.5}}, {"sequence_bias": {(banned,): -100.0, (28,): 3.5}}),
    ]
    for ours, theirs in cases:
        expected = [hf_generate(hf_model, p, 20, eos, **theirs) for p in prompts]
        for eng in (engine, small_cache_engine):  # chunked prompts, preemption and recompute
            params = SamplingParams(max_tokens=20, temperature=0.0, **ours)
            got = await asyncio.gather(*(collect(eng, p, params) for p in prompts))
            assert [g[0] for g in got] == expected, ours


async def test_frequency_and_presence_penalties_follow_openais_rule(engine, hf_model, mixed_prompts):
    """OpenAI's rule on the model's logits: subtract frequency x count + presence x [count > 0] over
    the output so far. transformers has no such processor: the reference loop applies the rule."""
    prompt = mixed_prompts[5][:60]
    frequency, presence = 0.8, 0.6
    out: list[int] = []
    counts = torch.zeros(hf_model.config.vocab_size)
    with torch.no_grad():
        for _ in range(16):
            logits = hf_model(torch.tensor([prompt + out])).logits[0, -1].float()
            logits = logits - (frequency * counts + presence * (counts > 0))
            token = int(logits.argmax())
            out.append(token)
            counts[token] += 1
    params = SamplingParams(max_tokens=16, temperature=0.0, frequency_penalty=frequency,
                            presence_penalty=presence, ignore_eos=True)  # fmt: skip
    got, _, _ = await collect(engine, prompt, params)
    assert got == out


async def test_min_tokens_bans_eos_and_defers_stops(engine, hf_model, tokenizer):
    eos = tokenizer.eos_token_id
    prompt = _chat(tokenizer, "What is the capital of France?")
    natural, text, last = await collect(engine, prompt, SamplingParams(max_tokens=48, temperature=0.0))
    assert last.finish_reason == "stop" and natural[-1] == eos and "Paris" in text
    want = len(natural) + 6
    params = SamplingParams(max_tokens=48, temperature=0.0, min_tokens=want, stop=["Paris"])
    got, text, _ = await collect(engine, prompt, params)
    assert len(got) >= want and eos not in got[: want - 1]
    assert got == hf_generate(hf_model, prompt, 48, eos, min_new_tokens=want)[: len(got)]
    assert "Paris" in tokenizer.decode(got[: len(natural)])  # the stop string came before min_tokens


async def test_logprobs_equal_log_softmax_of_transformers_logits(engine, hf_model, tokenizer, mixed_prompts):
    prompt = mixed_prompts[7][:80]
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=5, ignore_eos=True)
    outs = [o async for o in engine.generate(prompt, params)]
    logprobs = [lp for o in outs for lp in o.logprobs]
    tokens = [t for o in outs for t in o.token_ids]
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    assert len(logprobs) == len(tokens) == 8
    for step, lp in enumerate(logprobs):
        assert lp.token_id == tokens[step]
        assert abs(lp.logprob - ref[step, lp.token_id].item()) < 1e-4
        top_values, top_ids = ref[step].topk(5)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        assert max(abs(v - r) for (_, v), r in zip(lp.top, top_values.tolist(), strict=True)) < 1e-4


async def test_sampled_logprobs_describe_the_raw_distribution(engine, mixed_prompts):
    """A sampled token's logprob is the model's (before temperature), and the top list is ranked."""
    params = SamplingParams(max_tokens=6, temperature=1.4, seed=3, logprobs=3, ignore_eos=True)
    outs = [o async for o in engine.generate(mixed_prompts[2], params)]
    for lp in (lp for o in outs for lp in o.logprobs):
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and len(values) == 3
        assert lp.logprob <= values[0] + 1e-6


async def test_prompt_logprobs_score_the_prompt_without_generating(engine, hf_model, mixed_prompts):
    """lm-eval's loglikelihood requests: prompt-only, several at once, one of them longer than the
    step budget (scored over several chunks; such a request used to wait forever for its second
    chunk), beside a request that generates."""
    prompts = [mixed_prompts[1][:300], mixed_prompts[3], mixed_prompts[8], mixed_prompts[11]]
    assert len(prompts[0]) > engine.config.max_num_batched_tokens
    params = SamplingParams(max_tokens=0, prompt_logprobs=2)
    generating = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def score(prompt: list[int], asked: SamplingParams = params):
        return [o async for o in engine.generate(prompt, asked)]

    both = SamplingParams(max_tokens=4, prompt_logprobs=2, temperature=0.0, ignore_eos=True)
    *runs, scored_and_generated, decoded = await asyncio.gather(
        *(score(p) for p in prompts), score(prompts[0], both), score_text(engine, generating)
    )
    assert decoded == 8
    assert sum(len(o.token_ids) for o in scored_and_generated) == 4
    with_output = next(o.prompt_logprobs for o in scored_and_generated if o.prompt_logprobs is not None)
    alone = next(o.prompt_logprobs for o in runs[0] if o.prompt_logprobs is not None)
    assert [lp and lp.token_id for lp in with_output] == [lp and lp.token_id for lp in alone]
    for prompt, outs in zip(prompts, runs, strict=True):
        assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 0
        scored = next(o.prompt_logprobs for o in outs if o.prompt_logprobs is not None)
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0].float(), dim=-1)
        assert scored[0] is None and len(scored) == len(prompt)
        for i, lp in enumerate(scored[1:]):
            assert lp.token_id == prompt[i + 1]
            assert abs(lp.logprob - ref[i, prompt[i + 1]].item()) < 1e-4
            assert [t for t, _ in lp.top] == ref[i].topk(2).indices.tolist()


async def score_text(engine, params: SamplingParams) -> int:
    """Output tokens of a request generating beside the scoring ones."""
    return sum([len(o.token_ids) async for o in engine.generate(list(range(200, 260)), params)])


async def test_parallel_samples_share_the_prompt(
    engine, small_cache_engine, hf_model, tokenizer, mixed_prompts
):
    """n > 1: sample 0 keeps the request's seed (it equals the n = 1 answer), the others differ, and
    forks that start from the prompt's shared blocks and a copy of its last one compute exactly what
    a lone request does: greedy samples with a repetition penalty all equal transformers."""
    prompt = mixed_prompts[4][:45]  # 45 tokens: two full blocks shared, a partial one copied
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=77, ignore_eos=True)
    single, _, _ = await collect(engine, prompt, params)
    outs = [o async for o in engine.generate(prompt, SamplingParams(**{**_fields(params), "n": 3}))]
    by_index = {i: [t for o in outs if o.index == i for t in o.token_ids] for i in range(3)}
    assert by_index[0] == single
    assert len({tuple(v) for v in by_index.values()}) == 3
    assert sum(o.finished for o in outs) == 3
    eos = tokenizer.eos_token_id
    expected = hf_generate(hf_model, prompt, 12, eos, repetition_penalty=1.25)
    for eng in (engine, small_cache_engine):
        greedy = SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.25, n=3)
        outs = [o async for o in eng.generate(prompt, greedy)]
        for i in range(3):
            assert [t for o in outs if o.index == i for t in o.token_ids] == expected, (eng, i)
        assert eng.stats().kv_blocks_used == 0


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}
