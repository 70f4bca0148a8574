"""Structured output through the real ``openai`` client and the whole app (router → replica, SmolLM2
on the CPU): json_schema strict answers parse and validate, json_object gives an object, completions
take response_format as an extension, and bad schemas are 400s that point into the schema."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.cluster.helpers import ALICE, MODEL

pytest.importorskip("llguidance")

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Name a large city, its country and population as JSON."}]
PARAM = "response_format.json_schema.schema"


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}


def test_json_schema_strict_answers_match_the_schema(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=120, temperature=0, response_format=_format(CITY)
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), CITY)
    sampled = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=120, temperature=1.0, seed=4, n=3, response_format=_format(CITY)
    )
    for c in sampled.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), CITY)


def test_streamed_json_object_is_an_object(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": "Give me a JSON object with two keys, city and temperature, for Paris.",
            }
        ],
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_object"},
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text), dict)


def test_text_format_changes_nothing(client: openai.OpenAI) -> None:
    ask = dict(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**ask)
    text = client.chat.completions.create(**ask, response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_completions_take_response_format_as_an_extension(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=MODEL,
        prompt="A city as JSON:",
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": _format(CITY)},
    )
    jsonschema.validate(json.loads(resp.choices[0].text), CITY)


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"type": "objekt"}, "/type"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "/properties/a/$ref"),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "[a-"}}},
            "/properties/a/pattern",
        ),
    ],
)
def test_a_bad_schema_is_a_400_that_points_into_it(base_url: str, schema: dict, pointer: str) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 8, "response_format": _format(schema)}
    resp = httpx.post(
        f"{base_url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == PARAM
    assert f"'{pointer}'" in error["message"]


def test_the_openai_client_raises_bad_request_for_a_bad_schema(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8, response_format=_format({"type": "objekt"})
        )
    assert caught.value.body["param"] == PARAM
