"""Completions through the real ``openai`` client: a batch of prompts (text and token ids) answered as
one response with OpenAI's choice indexes, streamed too; echo in every combination; best_of."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from replica import Engine
from tests.cluster.helpers import ADMIN, ALICE, MODEL

PROMPTS = ["The capital of France is", "Once upon a time"]


def _by_index(choices) -> list:
    return sorted(choices, key=lambda c: c.index)


def _alone(client: openai.OpenAI, prompt, **kw) -> openai.types.Completion:
    return client.completions.create(
        **{"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, **kw}
    )


def test_a_batch_is_answered_prompt_by_prompt_with_openai_indexes(
    client: openai.OpenAI, base_url: str
) -> None:
    alone = [_alone(client, p) for p in PROMPTS]
    user = f"batch-{uuid.uuid4().hex[:8]}"
    resp = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0, n=2, user=user)
    choices = _by_index(resp.choices)
    assert [c.index for c in choices] == [0, 1, 2, 3]
    for c in choices:  # index = prompt index x n + choice
        assert c.text == alone[c.index // 2].choices[0].text
    assert resp.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert resp.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    # Each prompt was its own request: its own timing record, charged to the tenant, with the user.
    records = httpx.get(f"{base_url}/admin/timings", headers=ADMIN, timeout=30).json()
    mine = [r for r in records["records"] if r["user"] == user]
    assert len(mine) == 2 and {r["outcome"] for r in mine} == {"ok"}
    assert sorted(r["prompt_tokens"] for r in mine) == sorted(a.usage.prompt_tokens for a in alone)
    assert {r["tenant_id"] for r in mine} == {"alice"}


async def test_a_batch_of_token_id_lists_equals_the_text_batch(client: openai.OpenAI, engine: Engine) -> None:
    ids = [engine.tokenizer.encode(p, add_special_tokens=True) for p in PROMPTS]
    by_text = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert [c.text for c in _by_index(by_ids.choices)] == [c.text for c in _by_index(by_text.choices)]
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)


def test_a_streamed_batch_matches_the_whole_one_and_sums_its_usage(client: openai.OpenAI) -> None:
    ask = dict(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0.8, seed=3, n=2)
    whole = client.completions.create(**ask)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(**ask, stream=True, stream_options=opts))
    texts: dict[int, str] = {}
    finishes = {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert set(finishes) == {0, 1, 2, 3}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    # continuous usage: every chunk carries its prompt's tokens and its choice's tokens so far
    prompt_sizes = {_alone(client, p).usage.prompt_tokens for p in PROMPTS}
    for c in chunks[:-1]:
        assert c.usage is not None and c.usage.prompt_tokens in prompt_sizes
        assert 0 <= c.usage.completion_tokens <= 6


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_in_every_combination(client: openai.OpenAI, engine: Engine, stream: bool) -> None:
    ids = engine.tokenizer.encode(PROMPTS[1], add_special_tokens=False)
    cases = [
        dict(prompt=PROMPTS[0], n=2),
        dict(prompt=ids),
        dict(prompt=PROMPTS, logprobs=1),
        dict(prompt=[ids, engine.tokenizer.encode(PROMPTS[0], add_special_tokens=False)], n=2, logprobs=0),
    ]
    for case in cases:
        batch = isinstance(case["prompt"], list) and not isinstance(case["prompt"][0], int)
        prompts = case["prompt"] if batch else [case["prompt"]]
        texts = [p if isinstance(p, str) else engine.tokenizer.decode(p) for p in prompts]
        n = case.get("n", 1)
        ask = dict(model=MODEL, max_tokens=4, temperature=0, echo=True, stream=stream)
        resp = client.completions.create(**ask, **case)
        if stream:
            got: dict[int, str] = {}
            tokens: dict[int, int] = {}
            for chunk in resp:
                for c in chunk.choices:
                    got[c.index] = got.get(c.index, "") + c.text
                    tokens[c.index] = tokens.get(c.index, 0) + (len(c.logprobs.tokens) if c.logprobs else 0)
        else:
            got = {c.index: c.text for c in resp.choices}
            tokens = {c.index: len(c.logprobs.tokens) if c.logprobs else 0 for c in resp.choices}
        plain = _alone(client, case["prompt"], n=n, max_tokens=4)
        assert sorted(got) == list(range(len(prompts) * n)), case
        for index, text in got.items():
            assert text.startswith(texts[index // n]) and len(text) > len(texts[index // n]), (case, text)
            if "logprobs" in case:  # the prompt's tokens, then the answer's
                assert tokens[index] > len(engine.tokenizer.encode(texts[index // n])), case
        assert {i: t[len(texts[i // n]) :] for i, t in got.items()} == {
            c.index: c.text for c in plain.choices
        }


def test_echo_scores_a_batch(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=0, echo=True, logprobs=1)
    choices = _by_index(resp.choices)
    assert [c.text for c in choices] == PROMPTS and resp.usage.completion_tokens == 0
    for c in choices:
        assert c.logprobs.token_logprobs[0] is None and all(v < 0 for v in c.logprobs.token_logprobs[1:])


def test_best_of_returns_the_samples_of_highest_cumulative_logprob(client: openai.OpenAI) -> None:
    ask = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=8, temperature=1.0, seed=11)
    every = client.completions.create(**ask, n=3, logprobs=0)
    score = {c.text: sum(c.logprobs.token_logprobs) for c in every.choices}
    ranked = sorted(every.choices, key=lambda c: -score[c.text])
    best = client.completions.create(**ask, best_of=3)
    assert [c.text for c in best.choices] == [ranked[0].text] and best.choices[0].logprobs is None
    assert best.usage.completion_tokens == every.usage.completion_tokens  # every sample is generated
    two = client.completions.create(**ask, best_of=3, n=2, logprobs=0)
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [c.text for c in ranked[:2]]
    batch = client.completions.create(**{**ask, "prompt": PROMPTS}, best_of=3, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices[2:]] == [c.text for c in ranked[:2]]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"best_of": 2, "stream": True}, "best_of"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"best_of": 99}, "best_of"),
        ({"suffix": "the end"}, "suffix"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[1, 2], [10**9]]}, "prompt.1"),
        ({"prompt": ["x"] * 33}, "prompt"),
    ],
)
def test_bad_batches_and_options_are_400_naming_the_field(base_url: str, extra: dict, param: str) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, **extra}
    r = httpx.post(f"{base_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
