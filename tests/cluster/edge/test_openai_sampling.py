"""Sampling through the real ``openai`` client: n > 1 (streamed too), logprobs, echo with prompt
logprobs, seeds, penalties and vLLM's extra fields, and their bad values."""

from __future__ import annotations

import httpx
import openai
import pytest

from replica import Engine, SamplingParams
from tests.cluster.helpers import ALICE, MODEL

QUESTION = [{"role": "user", "content": "Write a haiku about rain."}]


def test_n_choices_with_a_seed_are_reproducible_and_distinct(client: openai.OpenAI) -> None:
    ask = dict(model=MODEL, messages=QUESTION, max_tokens=12, temperature=1.0, seed=42, n=3, logprobs=True)
    first = client.chat.completions.create(**ask)
    again = client.chat.completions.create(**ask)
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3
    assert (
        first.usage.completion_tokens
        == sum(len(c.logprobs.content) if c.logprobs else 0 for c in first.choices)
        or first.usage.completion_tokens >= 3
    )
    other = client.chat.completions.create(**{**ask, "seed": 43})
    assert [c.message.content for c in sorted(other.choices, key=lambda c: c.index)] != texts


def test_streamed_choices_carry_their_index_and_match_the_whole_response(client: openai.OpenAI) -> None:
    ask = dict(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0.9, seed=7, n=2)
    whole = client.chat.completions.create(**ask)
    stream = client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    texts, finishes, roles = {0: "", 1: ""}, {}, set()
    chunks = list(stream)
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.delta.role:
                roles.add(choice.index)
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert set(finishes) == {0, 1} and roles == {0, 1}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_chat_logprobs_are_the_models(client: openai.OpenAI, engine: Engine) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert "".join(e.token for e in content) == resp.choices[0].message.content
    prompt = engine.apply_chat_template(QUESTION)
    outs = [o async for o in engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0, logprobs=3))]
    expected = [lp for o in outs for lp in o.logprobs]
    for entry, ref in zip(content, expected, strict=True):
        assert abs(entry.logprob - ref.logprob) < 1e-4 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6
        assert entry.bytes == list(entry.token.encode())


async def test_completion_echo_scores_the_prompt(client: openai.OpenAI, engine: Engine) -> None:
    prompt = "The capital of France is Paris, and the capital of Italy is Rome."
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    choice = resp.choices[0]
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    assert choice.text == prompt and resp.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
    outs = [o async for o in engine.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=2))]
    scored = next(o.prompt_logprobs for o in outs if o.prompt_logprobs)
    got = choice.logprobs.token_logprobs[1:]
    assert max(abs(a - b.logprob) for a, b in zip(got, scored[1:], strict=True)) < 1e-4
    assert choice.logprobs.text_offset[0] == 0 and choice.logprobs.text_offset == sorted(
        choice.logprobs.text_offset
    )
    with_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, temperature=0)
    assert with_text.choices[0].text.startswith(prompt) and len(with_text.choices[0].text) > len(prompt)


async def test_penalties_bias_and_vllm_extras_change_the_answer_as_the_engine_does(
    client: openai.OpenAI, engine: Engine
) -> None:
    prompt = engine.apply_chat_template(QUESTION)
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    first = engine.tokenizer.encode(plain.choices[0].message.content, add_special_tokens=False)[0]
    extra = {"repetition_penalty": 1.2, "top_k": 20, "min_p": 0.05, "min_tokens": 12, "ignore_eos": True}
    resp = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, frequency_penalty=0.5,
        presence_penalty=0.3, logit_bias={str(first): -100}, extra_body=extra,
    )  # fmt: skip
    params = SamplingParams(
        max_tokens=12, temperature=0, frequency_penalty=0.5, presence_penalty=0.3, logit_bias={first: -100.0},
        repetition_penalty=1.2, top_k=20, min_p=0.05, min_tokens=12, ignore_eos=True,
    )  # fmt: skip
    expected = "".join([o.text async for o in engine.generate(prompt, params)])
    assert resp.choices[0].message.content == expected != plain.choices[0].message.content
    assert resp.usage.completion_tokens == 12


@pytest.mark.parametrize(
    "body",
    [
        {"top_logprobs": 3},  # without logprobs
        {"logprobs": True, "top_logprobs": 21},
        {"n": 0},
        {"presence_penalty": 2.5},
        {"logit_bias": {"-1": 5}},
        {"repetition_penalty": 0},
        {"stop_token_ids": [-3]},
    ],
)
def test_bad_sampling_values_are_400(base_url: str, body: dict) -> None:
    r = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION, "max_tokens": 4, **body},
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
