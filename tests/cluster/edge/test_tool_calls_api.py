"""Tool calls through the real ``openai`` client and the whole app (router → replica, SmolLM2 on the
CPU, whose template has no tools: the fallback prompt): a named or required choice gives calls whose
arguments match the tool's schema, streamed deltas join to the same call, a conversation with calls
and results goes on, and every bad input is a 400 (never a 500)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.cluster.helpers import ALICE, MODEL

pytest.importorskip("llguidance")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
AUTH = {"Authorization": f"Bearer {ALICE}"}


def _check_calls(calls: list, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _streamed(client: openai.OpenAI, **kw) -> tuple[list[dict], str | None, str]:
    """The calls a stream's deltas join to (OpenAI's rules: a delta with an id starts a call), its
    finish reason and its content."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or ():
            if tc.id is not None:
                assert tc.index not in calls and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


def test_a_named_choice_calls_that_function_streamed_or_not(client: openai.OpenAI) -> None:
    ask = dict(messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=80, temperature=0)
    resp = client.chat.completions.create(model=MODEL, **ask)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls(choice.message.tool_calls, {"get_weather"})
    assert len(choice.message.tool_calls) == 1
    calls, finish, content = _streamed(client, **ask)
    assert finish == "tool_calls" and content == ""
    first = choice.message.tool_calls[0]
    assert [(c["name"], c["arguments"]) for c in calls] == [(first.function.name, first.function.arguments)]


def test_required_calls_match_a_tool_streamed_or_not(client: openai.OpenAI) -> None:
    ask = dict(messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0)
    single = client.chat.completions.create(model=MODEL, parallel_tool_calls=False, **ask)
    assert single.choices[0].finish_reason == "tool_calls"
    _check_calls(single.choices[0].message.tool_calls, set(SCHEMAS))
    assert len(single.choices[0].message.tool_calls) == 1
    calls, finish, _ = _streamed(client, parallel_tool_calls=False, **ask)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in single.choices[0].message.tool_calls
    ]
    parallel = client.chat.completions.create(model=MODEL, **{**ask, "max_tokens": 200})
    choice = parallel.choices[0]
    if choice.finish_reason == "tool_calls":  # an array of calls, closed within max_tokens
        _check_calls(choice.message.tool_calls, set(SCHEMAS))
    else:
        assert choice.finish_reason == "length" and choice.message.tool_calls


def test_a_conversation_with_calls_and_results_goes_on(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=80, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),  # content null, as OpenAI sends it back
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "sunny"}'},
    ]
    assert history[1]["tool_calls"][0]["id"] == call.id
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=24, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    message = answer.choices[0].message
    assert message.content or message.tool_calls
    plain = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason != "tool_calls"


def test_auto_answers_are_content_or_calls(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=48, temperature=0
    )
    message = resp.choices[0].message
    if message.tool_calls:
        assert resp.choices[0].finish_reason in ("tool_calls", "length")
        assert all(c.function.name for c in message.tool_calls)
    else:
        assert message.content and resp.choices[0].finish_reason in ("stop", "length")
    calls, _, content = _streamed(client, messages=ASK, tools=TOOLS, max_tokens=48, temperature=0)
    assert content == (message.content or "")
    assert [c["name"] for c in calls] == [c.function.name for c in message.tool_calls or ()]


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}],
}
ANSWERED = {"role": "tool", "tool_call_id": "c1", "content": "12:00"}


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"tools": [{**TOOLS[0], "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
         "tools.0.function.parameters", "'/type'"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"a": {"$ref": "#/$defs/nowhere"}}}}}]},
         "tools.0.function.parameters", "'/properties/a/$ref'"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "nope"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "unique"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0.type", ""),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name", ""),
        ({"messages": [*ASK, CALLED, *ASK]}, "messages.1", "c1"),
        ({"messages": [*ASK, CALLED]}, "messages.1", "c1"),
        ({"messages": [*ASK, ANSWERED]}, "messages.1", "answers no open tool call"),
        ({"messages": [*ASK, CALLED, ANSWERED, ANSWERED]}, "messages.3", "answers no open tool call"),
        ({"messages": [*ASK, {**CALLED, "tool_calls": [{**CALLED["tool_calls"][0], "function":
          {"name": "get_time", "arguments": "not json"}}]}, ANSWERED]},
         "messages.1.tool_calls.0.function.arguments", "JSON object"),
        ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages.1", "tool_call_id"),
        ({"messages": [{**ASK[0], "tool_calls": CALLED["tool_calls"]}, ANSWERED]}, "messages.0", "assistant"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice", "response_format"),
        ({"functions": [TOOLS[0]["function"]]}, "functions", "deprecated"),
    ],
)  # fmt: skip
def test_bad_tool_inputs_are_400s_naming_the_field(
    base_url: str, change: dict, param: str, says: str
) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, **change}
    resp = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert says in error["message"], error


def test_the_openai_client_raises_bad_request_for_a_dangling_call(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[*ASK, CALLED, *ASK], tools=TOOLS, max_tokens=4)
    assert caught.value.body["param"] == "messages.1"
