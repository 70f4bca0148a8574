"""Tool calls without a cluster: the parsers of both families (whole and streamed, split anywhere),
the stream's deltas, the forcing grammar, the history rule and the prompt's tools."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from cluster.edge.openai_schemas import ChatCompletionRequest
from cluster.edge.tool_answers import ChunkShaper, ToolPlan
from cluster.edge.tool_grammar import tool_grammar
from cluster.edge.tool_schemas import history_problem
from cluster.text.chat_template import render_chat
from cluster.text.tool_call_scanner import CallDelta, Content
from cluster.text.tool_parsers import new_parser, parse_all
from cluster.text.tool_prompt import FALLBACK_CALLS, FALLBACK_HEADER, parser_family, template_inputs
from tests.cluster.conftest import REPO

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
HERMES = (
    "Let me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris \\"Centre\\" {}", "unit": "c"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>\n'
)
HERMES_CALLS = [
    ("get_weather", '{"city": "Paris \\"Centre\\" {}", "unit": "c"}'),
    ("get_weather", '{"city": "Oslo"}'),
]
LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome", "nested": [1, {"a": "}"}]}}; '
    '{"name": "get_time", "parameters": {}}'
)
LLAMA_CALLS = [
    ("get_weather", '{"city": "Rome", "nested": [1, {"a": "}"}]}'),
    ("get_time", "{}"),
]


def _streamed(family: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[list]]:
    parser = new_parser(family)  # type: ignore[arg-type]
    steps = [parser.feed(p) for p in pieces] + [parser.finish()]
    content = "".join(e.text for step in steps for e in step if isinstance(e, Content))
    calls: dict[int, list] = {}
    for event in (e for step in steps for e in step if isinstance(e, CallDelta)):
        if event.id is not None:
            assert event.index not in calls, "the id and name come once, first"
            assert event.id.startswith("call_") and len(event.id) == 29
            calls[event.index] = [event.name, ""]
        calls[event.index][1] += event.arguments
    return content, [tuple(calls[i]) for i in sorted(calls)], steps


def _splits(text: str) -> list[list[str]]:
    """Every piece size from 1 to 12 characters, and random cuts."""
    out = [[text[i : i + size] for i in range(0, len(text), size)] for size in range(1, 13)]
    rng = random.Random(7)
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(text)), 6))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


@pytest.mark.parametrize(
    ("family", "text", "content", "calls"),
    [("hermes", HERMES, "Let me look.", HERMES_CALLS), ("llama3_json", LLAMA, "", LLAMA_CALLS)],
)
def test_whole_and_streamed_answers_give_the_same_calls(family, text, content, calls) -> None:
    whole_content, whole_calls = parse_all(new_parser(family), text)
    assert whole_content == content
    assert [(c["name"], c["arguments"]) for c in whole_calls] == calls
    for pieces in _splits(text):
        assert _streamed(family, pieces)[:2] == (content, calls), pieces


def test_hermes_streams_the_name_before_the_arguments_end() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    cut = text.index("Par")
    _, _, steps = _streamed("hermes", [text[:cut], text[cut:]])
    first = [e for e in steps[0] if isinstance(e, CallDelta)]
    assert first[0].name == "get_weather" and first[0].arguments == ""
    assert "".join(e.arguments for e in first) == '{"city": "'  # the arguments so far, already sent


def test_text_that_only_looks_like_a_call_stays_content() -> None:
    for family, text in [
        ("hermes", "1 < 2 and <tool_ is no tag\n"),
        ("hermes", "<tool_call>not json</tool_call> after"),
        ("llama3_json", "Paris is in France.\n"),
        ("llama3_json", '{"city": "Paris"}'),  # JSON, but no call (no name)
    ]:
        content, calls = parse_all(new_parser(family), text)
        assert (
            calls == []
            and content.strip() == text.replace("<tool_call>", "").replace("</tool_call>", "").strip()
        ), (family, text)
        for pieces in _splits(text):
            assert _streamed(family, pieces)[:2] == (content, []), pieces


def test_forced_answers_are_one_call_or_an_array() -> None:
    one = '{"name": "f", "arguments": {"x": 1}}'
    many = '[{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]'
    assert [(c["name"], c["arguments"]) for c in parse_all(new_parser("forced"), one)[1]] == [
        ("f", '{"x": 1}')
    ]
    assert [c["name"] for c in parse_all(new_parser("forced"), many)[1]] == ["f", "g"]
    for pieces in _splits(many):
        assert _streamed("forced", pieces)[1] == [("f", '{"x": 1}'), ("g", "{}")]


def test_a_call_cut_short_keeps_its_index_and_the_next_one_follows() -> None:
    cut = '<tool_call>{"name": "f", "arguments": {"x": </tool_call>'
    text = cut + '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    _, calls = parse_all(new_parser("hermes"), text)
    assert [c["name"] for c in calls] == ["f", "g"]


def _chunk(index: int, text: str, finish: str | None = None, role: bool = False) -> dict:
    delta = {"content": text, **({"role": "assistant"} if role else {})}
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }


def test_the_stream_deltas_are_openais() -> None:
    shaper = ChunkShaper(ToolPlan("hermes", parallel=True))
    pieces = [
        "Checking",
        ".\n<tool",
        '_call>{"name": "get_weather", ',
        '"arguments": {"ci',
        'ty": "Paris"}}</tool_call>',
    ]
    chunks = [c for i, p in enumerate(pieces) for c in shaper(_chunk(0, p, role=i == 0))]
    chunks += shaper(_chunk(0, "", finish="stop"))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": "Checking"}
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in tc and "name" not in tc["function"] for tc in calls[1:])
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_each_choice_has_its_own_parser_and_one_call_without_parallel_calls() -> None:
    shaper = ChunkShaper(ToolPlan("hermes", parallel=False))
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}'
    chunks = [*shaper(_chunk(0, two[:30], role=True)), *shaper(_chunk(1, "Plain text", role=True))]
    chunks += [
        *shaper(_chunk(0, two[30:] + "</tool_call>", finish="stop")),
        *shaper(_chunk(1, ".", finish="stop")),
    ]
    by_choice: dict[int, list] = {0: [], 1: []}
    for c in chunks:
        by_choice[c["choices"][0]["index"]].append(c["choices"][0])
    calls = [tc for ch in by_choice[0] for tc in ch["delta"].get("tool_calls", [])]
    assert {tc["index"] for tc in calls} == {0} and calls[0]["function"]["name"] == "a"
    assert by_choice[0][-1]["finish_reason"] == "tool_calls"
    assert "".join(ch["delta"].get("content") or "" for ch in by_choice[1]) == "Plain text."
    assert by_choice[1][-1]["finish_reason"] == "stop"


def test_one_call_only_without_parallel_calls() -> None:
    plan = ToolPlan("hermes", parallel=False)
    body = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": HERMES}, "finish_reason": "stop"}
        ]
    }
    message = plan.rewrite(body)["choices"][0]["message"]
    assert len(message["tool_calls"]) == 1 and message["content"] == "Let me look."


def _request(**fields) -> ChatCompletionRequest:
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "person", "parameters": PERSON}},
    ]
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, **fields}
    )


PERSON = {  # as pydantic writes a recursive model: $defs and refs to them
    "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "type": "object",
    "properties": {
        "home": {"$ref": "#/$defs/Addr"},
        "friends": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["home"],
}


def test_the_grammar_of_each_forced_choice() -> None:
    named = json.loads(
        tool_grammar(_request(tool_choice={"type": "function", "function": {"name": "person"}}))["schema"]
    )
    call = {
        "name": "person",
        "arguments": {"home": {"city": "Oslo"}, "friends": [{"home": {"city": "Rome"}}]},
    }
    jsonschema.validate(call, named)
    extra = {"name": "person", "arguments": {"home": {"city": "Oslo", "zip": "0150"}}}
    jsonschema.validate(extra["arguments"], PERSON)  # the tool's schema allows other keys...
    wrong_calls = [{**call, "name": "get_weather"}, {"name": "person", "arguments": {"friends": []}}, extra]
    for wrong in wrong_calls:  # ...the grammar does not (a subset: what it writes, the tool takes)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, named)
    required = json.loads(tool_grammar(_request(tool_choice="required"))["schema"])
    jsonschema.validate([call, {"name": "get_weather", "arguments": {"city": "Oslo"}}], required)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], required)
    single = json.loads(tool_grammar(_request(tool_choice="required", parallel_tool_calls=False))["schema"])
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, single)
    assert tool_grammar(_request(tool_choice="auto")) is None and tool_grammar(_request()) is None


def _messages(*raw: dict) -> list:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": list(raw)}).messages


CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
]}  # fmt: skip
USER = {"role": "user", "content": "hi"}


def test_the_history_rule() -> None:
    answered = [_tool("c1"), _tool("c2")]
    assert history_problem(_messages(USER, CALL, *answered, USER)) is None
    assert history_problem(_messages(USER, CALL, _tool("c1"), USER))[0] == 1  # c2 dangling
    assert history_problem(_messages(USER, CALL))[0] == 1
    assert history_problem(_messages(USER, _tool("c9")))[0] == 1  # answers no call
    assert history_problem(_messages(USER, CALL, *answered, _tool("c1")))[0] == 4  # answered twice


def _tool(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "42"}


# What tool-aware templates (Hermes 2 Pro, Llama 3.1) ask of the messages: no tool_calls key on a plain
# assistant message, arguments as an object (they write it with tojson), a name on each tool result.
TOOL_AWARE = (
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls is defined %}"
    "{% for c in m.tool_calls %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>"
    "{% endfor %}{% elif m.role == 'tool' %}"
    "{% if m.name is not defined %}{{ raise_exception('tool results need a name') }}{% endif %}"
    "<result {{ m.name }}>{{ m.content }}</result>{% else %}<{{ m.role }}>{{ m.content }}{% endif %}"
    "{% endfor %}{% for t in tools %}<tool>{{ t.function.name }}</tool>{% endfor %}"
)


def test_a_tool_aware_template_renders_the_calls_and_results() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [USER, CALL, _tool("c1"), _tool("c2"), {"role": "assistant", "content": "ok"}],
        }
    )
    messages = request.template_messages()
    out, extra = template_inputs(
        TOOL_AWARE, messages, [{"type": "function", "function": {"name": "f"}}], "hermes"
    )
    text = render_chat(TOOL_AWARE, out, {}, **extra)
    assert text == (
        '<user>hi<call>f {}</call><call>f {"a": 1}</call><result f>42</result><result f>42</result>'
        "<assistant>ok<tool>f</tool>"
    )


def test_templates_with_tools_get_them_and_others_get_the_fallback() -> None:
    messages = [m.template_dict() for m in _messages(USER, CALL, _tool("c1"), _tool("c2"))]
    tools = [{"type": "function", "function": {"name": "f", "parameters": WEATHER}}]
    knows = "{% for t in tools %}{{ t.function.name }}{% endfor %}{{ messages }}"
    out, extra = template_inputs(knows, messages, tools, "hermes")
    assert out is messages and extra == {"tools": tools}
    assert out[1]["tool_calls"][1]["function"]["arguments"] == {"a": 1}  # an object, as templates expect
    plain, extra = template_inputs("{{ messages }}", messages, tools, "hermes")
    assert extra == {} and [m["role"] for m in plain] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' not in plain[0]["content"] and '"name": "f"' in plain[0]["content"]
    assert plain[2]["content"].count("<tool_call>") == 2
    assert plain[3]["content"].count("<tool_response>") == 2


def test_the_family_is_configured_or_read_from_the_template() -> None:
    assert parser_family("{{ '<tool_call>' }}", "auto") == "hermes"
    assert parser_family("{{ '<|python_tag|>' }} ipython", "auto") == "llama3_json"
    assert parser_family("{{ messages }}", "auto") == "hermes"
    assert parser_family("{{ '<tool_call>' }}", "llama3_json") == "llama3_json"


def test_the_docs_show_the_fallback_prompt() -> None:
    with open(f"{REPO}/docs/openai.md") as f:
        docs = f.read()
    assert FALLBACK_HEADER.split("{tools}")[0] in docs and FALLBACK_CALLS["hermes"] in docs
