"""Chat through the real ``openai`` client, field by field: continuous usage on every chunk, the
informational fields (accepted, the answer unchanged, ``user`` recorded), message roles, names,
text parts and an assistant's null content, and the refusals (OpenAI error bodies naming the field)."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from tests.cluster.helpers import ADMIN, ALICE, MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = dict(model=MODEL, max_tokens=8, temperature=0)


def _answer(client: openai.OpenAI, messages: list, **kw) -> str:
    resp = client.chat.completions.create(messages=messages, **{**GREEDY, **kw})
    return resp.choices[0].message.content


@pytest.mark.parametrize("n", [1, 2])
def test_continuous_usage_rides_on_every_chunk(client: openai.OpenAI, n: int) -> None:
    whole = client.chat.completions.create(messages=QUESTION, n=n, **GREEDY)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    stream = client.chat.completions.create(
        messages=QUESTION, n=n, stream=True, stream_options=opts, **GREEDY
    )
    chunks = list(stream)
    body, tail = chunks[:-1], chunks[-1]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert tail.choices == [] and [getattr(tail.usage, k) for k in counts] == [
        getattr(whole.usage, k) for k in counts
    ]
    seen: dict[int, int] = {}
    for c in body:
        assert c.usage is not None and c.usage.prompt_tokens == whole.usage.prompt_tokens
        index = c.choices[0].index
        assert c.usage.completion_tokens >= seen.get(index, 0)  # that choice's tokens so far
        seen[index] = c.usage.completion_tokens
        assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    assert sum(seen.values()) == whole.usage.completion_tokens
    # without include_usage, as vLLM: no usage anywhere
    bare = list(
        client.chat.completions.create(
            messages=QUESTION, stream=True, stream_options={"continuous_usage_stats": True}, **GREEDY
        )
    )
    assert all(c.usage is None for c in bare)


def test_informational_fields_leave_the_answer_as_it_was_and_user_is_recorded(
    client: openai.OpenAI, base_url: str
) -> None:
    plain = _answer(client, QUESTION)
    user = f"u-{uuid.uuid4().hex[:8]}"
    informed = _answer(
        client,
        QUESTION,
        user=user,
        metadata={"team": "search", "ticket": "42"},
        store=True,
        service_tier="priority",
        prompt_cache_key="faq",
        prompt_cache_retention="24h",
        safety_identifier="h-1",
        verbosity="low",
        reasoning_effort="low",
        prediction={"type": "content", "content": "Paris"},
        modalities=["text"],
        tools=[],
        tool_choice="none",
        stream_options=None,
        extra_body={"prompt_cache_options": {"mode": "implicit"}},
    )
    assert informed == plain
    records = httpx.get(f"{base_url}/admin/timings", headers=ADMIN, timeout=30).json()["records"]
    mine = [r for r in records if r["user"] == user]
    assert len(mine) == 1 and mine[0]["tenant_id"] == "alice" and mine[0]["outcome"] == "ok"


def test_nulls_mean_the_default(client: openai.OpenAI) -> None:
    plain = _answer(client, QUESTION)
    nulls = {"top_p": None, "n": None, "presence_penalty": None, "stop": None, "logprobs": None, "seed": None}
    assert _answer(client, QUESTION, extra_body=nulls) == plain


def test_roles_names_parts_and_null_assistant_content_render_as_plain_text(client: openai.OpenAI) -> None:
    plain = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    rich = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "Answer in "}, {"type": "text", "text": "one word."}],
        },
        {"role": "user", "content": [{"type": "text", "text": "Hello"}], "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "What is the capital of France?", "name": "ann"},
    ]
    assert _answer(client, rich) == _answer(client, plain)
    refused_before = [*plain[:2], {"role": "assistant", "content": None, "refusal": "I cannot."}, plain[3]]
    as_text = [*plain[:2], {"role": "assistant", "content": "I cannot."}, plain[3]]
    assert _answer(client, refused_before) == _answer(client, as_text)


@pytest.mark.parametrize(
    ("kw", "param", "words"),
    [
        ({"functions": [{"name": "f"}]}, "functions", "deprecated `functions`"),
        ({"function_call": "auto"}, "function_call", "deprecated `functions`"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio"),
        ({"modalities": ["text", "audio"]}, "modalities", "audio"),
        ({"extra_body": {"moderation": {"model": "omni-moderation-latest"}}}, "moderation", "moderation"),
        ({"web_search_options": {}}, "web_search_options", "web search"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content",
            "image input",
        ),
        (
            {"messages": [{"role": "tool", "content": "4", "tool_call_id": "c"}]},
            "messages.0",
            "no open tool call",
        ),
        ({"messages": [{"role": "function", "content": "4", "name": "f"}]}, "messages.0", "deprecated"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate", "unrecognized"),
    ],
)
def test_refusals_are_openai_errors_naming_the_field(client: openai.OpenAI, kw: dict, param: str, words: str):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{"messages": QUESTION, **GREEDY, **kw})
    assert err.value.status_code == 400
    body = err.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error", body
    assert words in body["message"], body


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [7]}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "metadata": {"k": 1}}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "metadata": {str(i): "v" for i in range(17)}},
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "verbosity": "loud"}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"x": 1}},
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream_options": 3}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": "all"}),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
        ("/v1/completions", {"prompt": [["a"]]}),
        ("/v1/completions", {"prompt": [[1], "a"]}),
        ("/v1/completions", {"prompt": [{"text": "a"}]}),
        ("/v1/completions", {"prompt": ["a", "b"], "best_of": 0}),
        ("/v1/completions", {"prompt": ["a", "b"], "n": 3, "best_of": 2}),
        ("/v1/completions", {"prompt": [[], [1]]}),
        ("/v1/completions", {"prompt": ["a", "b"], "echo": "yes please"}),
    ],
)
def test_bad_input_on_every_new_path_is_an_openai_400(base_url: str, path: str, body: dict) -> None:
    r = httpx.post(
        f"{base_url}{path}",
        json={"model": MODEL, "max_tokens": 2, **body},
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"], error  # it names what is wrong
