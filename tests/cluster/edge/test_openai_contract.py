"""Every field of the installed ``openai`` package's chat and completions requests has a treatment in
``cluster/edge/openai_fields.py`` (works / informational / refused), and the server keeps it: a
request with any field gets a 2xx, or, for a refused one, a 400 naming that field. A field added
upstream fails here until it is given a treatment (and a sample below)."""

from __future__ import annotations

import typing

import httpx
import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import (
    ChatCompletionContentPartParam,
    ChatCompletionMessageParam,
    ChatCompletionStreamOptionsParam,
)
from openai.types.chat import completion_create_params as chat_params

from cluster.edge.chat_messages import ChatMessage
from cluster.edge.openai_fields import (
    CHAT,
    COMPLETIONS,
    CONTENT_PARTS,
    MESSAGE,
    STREAM_OPTIONS,
    FieldTreatment,
    Treatment,
    markdown,
)
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest, StreamOptions
from tests.cluster.conftest import REPO
from tests.cluster.helpers import ALICE, MODEL

AUTH = {"Authorization": f"Bearer {ALICE}"}
HELLO = [{"role": "user", "content": "Say hi."}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {  # an assistant's call, answered by a tool message (a call left unanswered is a 400)
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}

# A request with each field asking for something (companions a field needs ride along).
SAMPLES: dict[str, dict] = {
    "model": {"model": MODEL},
    "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.9},
    "n": {"n": 2},
    "seed": {"seed": 7},
    "stop": {"stop": ["\n"]},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "logit_bias": {"logit_bias": {"42": 1}},
    "user": {"user": "end-user-1"},
    "messages": {"messages": HELLO},
    "max_completion_tokens": {"max_completion_tokens": 2},
    "max_tokens": {"max_tokens": 2},
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "metadata": {"metadata": {"team": "search"}},
    "store": {"store": True},
    "service_tier": {"service_tier": "priority"},
    "prompt_cache_key": {"prompt_cache_key": "k1"},
    "prompt_cache_retention": {"prompt_cache_retention": "24h"},
    "prompt_cache_options": {"prompt_cache_options": {"mode": "implicit", "ttl": "30m"}},
    "safety_identifier": {"safety_identifier": "hash-1"},
    "verbosity": {"verbosity": "low"},
    "reasoning_effort": {"reasoning_effort": "low"},
    "prediction": {"prediction": {"type": "content", "content": "Hi"}},
    "modalities": {"modalities": ["text"]},
    "audio": {"audio": {"voice": "alloy", "format": "mp3"}},
    "moderation": {"moderation": {"model": "omni-moderation-latest"}},
    "web_search_options": {"web_search_options": {"search_context_size": "low"}},
    "response_format": {"response_format": {"type": "json_object"}},
    "tools": {"tools": [TOOL]},
    "tool_choice": {"tools": [TOOL], "tool_choice": "required"},
    "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": False},
    "functions": {"functions": [TOOL["function"]]},
    "function_call": {"function_call": "auto"},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "repetition_penalty": {"repetition_penalty": 1.1},
    "min_tokens": {"min_tokens": 1},
    "stop_token_ids": {"stop_token_ids": [2]},
    "ignore_eos": {"ignore_eos": True},
    "cache_salt": {"cache_salt": "salt-1"},
    "prompt": {"prompt": ["Hello", "Hi"]},
    "echo": {"echo": True},
    "best_of": {"best_of": 2},
    "suffix": {"suffix": " the end."},
}
# Where the endpoints' fields of one name differ in type.
COMPLETION_SAMPLES = SAMPLES | {"logprobs": {"logprobs": 2}}
MESSAGE_SAMPLES: dict[str, dict] = {
    "role": {"role": "developer", "content": "Be brief."},
    "content": {"role": "assistant", "content": None},
    "name": {"role": "user", "content": "Hi", "name": "ann"},
    "refusal": {"role": "assistant", "content": None, "refusal": "I cannot."},
    "audio": {"role": "assistant", "content": "x", "audio": {"id": "a1"}},
    "tool_calls": [CALL, {"role": "tool", "content": "42", "tool_call_id": "c1"}],
    "function_call": {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "f", "arguments": "{}"},
    },
    "tool_call_id": [CALL, {"role": "tool", "content": "42", "tool_call_id": "c1"}],
}  # a list: a conversation that uses the field (a call is answered before the next message)
PART_SAMPLES: dict[str, dict] = {
    "text": {"type": "text", "text": "Hi", "prompt_cache_breakpoint": {"mode": "explicit"}},
    "refusal": {"type": "refusal", "refusal": "I cannot."},
    "image_url": {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    "input_audio": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    "file": {"type": "file", "file": {"file_id": "f1"}},
    "video_url": {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
    "audio_url": {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
}


def _keys(typed_dict: type) -> set[str]:
    return set(typed_dict.__annotations__)


def _union_members(alias: object) -> list[type]:
    return list(typing.get_args(alias))


def test_every_upstream_request_field_has_a_treatment() -> None:
    chat = _keys(chat_params.CompletionCreateParamsBase) | _keys(chat_params.CompletionCreateParamsStreaming)
    completions = _keys(completion_params.CompletionCreateParamsBase) | _keys(
        completion_params.CompletionCreateParamsStreaming
    )
    assert chat - set(CHAT) == set(), "chat fields without a treatment in openai_fields.CHAT"
    assert completions - set(COMPLETIONS) == set(), "completions fields without a treatment"
    assert _keys(ChatCompletionStreamOptionsParam) - set(STREAM_OPTIONS) == set()
    message_keys = set().union(*(_keys(m) for m in _union_members(ChatCompletionMessageParam)))
    assert message_keys - set(MESSAGE) == set(), "message fields without a treatment"
    part_types = {
        typing.get_args(typing.get_type_hints(p)["type"])[0]
        for p in _union_members(ChatCompletionContentPartParam)
    }
    assert part_types - set(CONTENT_PARTS) == set(), "content part types without a treatment"


def test_the_request_models_take_every_field_of_the_table() -> None:
    assert set(CHAT) <= set(ChatCompletionRequest.model_fields)
    assert set(COMPLETIONS) <= set(CompletionRequest.model_fields)
    assert set(MESSAGE) <= set(ChatMessage.model_fields)
    assert set(STREAM_OPTIONS) <= set(StreamOptions.model_fields)


def test_the_docs_show_the_table() -> None:
    with open(f"{REPO}/docs/openai.md") as f:
        assert markdown() in f.read(), "docs/openai.md: paste `python -m cluster.edge.openai_fields`"


def _post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, headers=AUTH, timeout=120)


def _check(resp: httpx.Response, treatment: FieldTreatment, param: str, inside: bool = False) -> None:
    """2xx, or for a refused field a 400 whose param is the field (``inside``: or a field within it)."""
    assert resp.status_code < 500, resp.text
    if treatment.treatment is Treatment.REFUSED:
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        named = error["param"] == param or (inside and str(error["param"]).startswith(param + "."))
        assert named and error["type"] == "invalid_request_error", error
    else:
        assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("field", list(CHAT))
def test_each_chat_field_works_informs_or_is_refused_by_name(base_url: str, field: str) -> None:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 2, **SAMPLES[field]}
    _check(_post(base_url, "/v1/chat/completions", body), CHAT[field], field)


@pytest.mark.parametrize("field", list(COMPLETIONS))
def test_each_completions_field_works_informs_or_is_refused_by_name(base_url: str, field: str) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, **COMPLETION_SAMPLES[field]}
    _check(_post(base_url, "/v1/completions", body), COMPLETIONS[field], field)


@pytest.mark.parametrize("field", list(STREAM_OPTIONS))
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_each_stream_option_is_taken(base_url: str, path: str, field: str) -> None:
    body = {"model": MODEL, "messages": HELLO, "prompt": "Hello", "max_tokens": 2, "stream": True}
    body.pop("prompt" if "chat" in path else "messages")
    body["stream_options"] = {"include_usage": True, field: True}
    _check(_post(base_url, path, body), STREAM_OPTIONS[field], "stream_options")


@pytest.mark.parametrize("field", list(MESSAGE))
def test_each_message_field_works_or_is_refused_naming_the_message(base_url: str, field: str) -> None:
    sample = MESSAGE_SAMPLES[field]
    messages = sample if isinstance(sample, list) else [sample]
    body = {"model": MODEL, "messages": [*messages, *HELLO], "max_tokens": 2}
    _check(_post(base_url, "/v1/chat/completions", body), MESSAGE[field], "messages.0", inside=True)


@pytest.mark.parametrize("kind", list(CONTENT_PARTS))
def test_each_content_part_works_or_is_refused_naming_the_content(base_url: str, kind: str) -> None:
    role = "assistant" if kind == "refusal" else "user"
    message = {"role": role, "content": [PART_SAMPLES[kind]]}
    body = {"model": MODEL, "messages": [message, *HELLO], "max_tokens": 2}
    _check(_post(base_url, "/v1/chat/completions", body), CONTENT_PARTS[kind], "messages.0.content")


def _sdk_call(create, upstream: set[str], body: dict, stream: bool) -> None:
    """One request through the openai SDK: its own keyword arguments, the rest in extra_body; a
    stream is read to its end (usage chunk and all)."""
    kw = {k: v for k, v in body.items() if k in upstream}
    extra = {k: v for k, v in body.items() if k not in upstream}
    resp = create(**kw, extra_body=extra or None)
    if stream:
        chunks = list(resp)
        assert chunks and any(c.choices for c in chunks)
    else:
        usage = resp.usage
        assert resp.choices and usage.prompt_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert usage.completion_tokens >= 1 or body.get("max_tokens") == 0  # it generated


@pytest.mark.parametrize("stream", [False, True])
def test_every_field_that_works_through_the_openai_sdk(client, stream: bool) -> None:
    """Each field that works or informs, sent by the real SDK, streamed and not."""
    chat_keys = _keys(chat_params.CompletionCreateParamsBase) | {"stream"}
    completion_keys = _keys(completion_params.CompletionCreateParamsBase) | {"stream"}
    cases = [
        (client.chat.completions.create, chat_keys, {"messages": HELLO, **SAMPLES[f]}, f)
        for f, t in CHAT.items()
        if t.treatment is not Treatment.REFUSED
    ] + [
        (client.completions.create, completion_keys, {"prompt": "Hello", **COMPLETION_SAMPLES[f]}, f)
        for f, t in COMPLETIONS.items()
        if t.treatment is not Treatment.REFUSED
    ]
    for create, upstream, sample, field in cases:
        body = {"model": MODEL, "max_tokens": 2, "stream": stream, **sample}
        if body["stream"] and "stream_options" not in body:
            body["stream_options"] = {"include_usage": True}
        if field == "best_of" and body["stream"]:  # best_of above n is not streamed (as OpenAI)
            with pytest.raises(openai.BadRequestError) as err:
                _sdk_call(create, upstream, body, True)
            assert err.value.body["param"] == "best_of"
            continue
        try:
            _sdk_call(create, upstream, body, body["stream"])
        except Exception as exc:
            raise AssertionError(f"{field} (stream={body['stream']}) through the SDK") from exc
