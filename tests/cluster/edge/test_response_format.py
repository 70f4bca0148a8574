"""The router's side of response_format, without Ray: the body's model, the wire field, and the schema
checks (metaschema with a JSON pointer, $refs, the grammar library's own verdict), none of which
loads torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.edge.response_format import PARAM, ResponseFormat, check_grammar, grammar_fields
from cluster.errors import BadRequest
from replica import SamplingParams

HELLO = [{"role": "user", "content": "hi"}]


def _format(schema: dict | None = None) -> dict:
    inner = {"name": "answer", "strict": True} | ({"schema": schema} if schema is not None else {})
    return {"type": "json_schema", "json_schema": inner}


def test_the_three_types_become_the_wire_field_sampling_params_take():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    assert grammar_fields(ResponseFormat(type="text")) is None
    assert grammar_fields(ResponseFormat(type="json_object")) == {"kind": "json_object"}
    fields = grammar_fields(ResponseFormat.model_validate(_format(schema)))
    assert fields == {
        "kind": "json_schema",
        "schema": '{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}',
    }
    params = SamplingParams(max_tokens=4, grammar=fields)  # key order kept: it is the answer's order
    assert params.grammar.schema == fields["schema"] and not params.plain_greedy
    assert grammar_fields(ResponseFormat.model_validate(_format())) == {"kind": "json_object"}


def test_chat_and_completions_bodies_take_it():
    chat = ChatCompletionRequest(model="m", messages=HELLO, response_format=_format({"type": "object"}))
    assert chat.sampling_fields()["grammar"]["kind"] == "json_schema"
    completion = CompletionRequest(model="m", prompt="x", response_format={"type": "json_object"})
    assert completion.sampling_fields()["grammar"] == {"kind": "json_object"}
    assert ChatCompletionRequest(model="m", messages=HELLO).sampling_fields()["grammar"] is None


@pytest.mark.parametrize(
    "body",
    [
        {"type": "json_schema"},  # no json_schema
        {"type": "json_object", "json_schema": {"name": "x"}},
        {"type": "yaml"},
        {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
    ],
)
def test_malformed_formats_are_refused(body):
    with pytest.raises(ValidationError):
        ResponseFormat.model_validate(body)


@pytest.mark.parametrize(
    ("schema", "pointer", "words"),
    [
        ({"type": "objekt"}, "/type", "not valid"),
        ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "/properties/a/$ref", "resolves nowhere"),
        ({"properties": {"a": {"$ref": "https://example.com/s.json"}}}, "/properties/a/$ref", "only local"),
        ({"properties": {"a": {"type": "string", "pattern": "[a-"}}}, "/properties/a/pattern", "regex"),
        ({"type": "string", "not": {"const": "x"}}, "/", "not"),  # valid JSON Schema, no grammar for it
    ],
)
async def test_bad_schemas_are_400s_that_point_into_them(schema, pointer, words):
    with pytest.raises(BadRequest) as caught:
        await check_grammar(grammar_fields(ResponseFormat.model_validate(_format(schema))))
    assert caught.value.param == PARAM and caught.value.status_code == 400
    message = str(caught.value)
    assert f"at '{pointer}'" in message and words in message, message


async def test_good_schemas_pass():
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/word"}, "n": {"type": "integer", "minimum": 0}},
        "required": ["a", "n"],
        "$defs": {"word": {"type": "string", "maxLength": 8}},
        "additionalProperties": False,
    }
    await check_grammar(grammar_fields(ResponseFormat.model_validate(_format(schema))))
    await check_grammar({"kind": "json_object"})
    await check_grammar(None)


def test_checking_a_schema_loads_no_torch():
    code = (
        "import asyncio, sys\n"
        "from cluster.edge.response_format import check_grammar\n"
        "asyncio.run(check_grammar({'kind': 'json_schema', 'schema': '{\"type\":\"object\"}'}))\n"
        "import llguidance\n"
        "assert 'torch' not in sys.modules, 'torch was loaded'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
