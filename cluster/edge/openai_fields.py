"""What fairlane does with every field of OpenAI's chat and completions requests, in one table.

Each field either works, is accepted and only informs (its treatment says what happens to it), or is
refused with a 400 naming it and saying why. The request models (``openai_schemas.py``,
``chat_messages.py``, ``request_extras.py``) follow this table, and ``docs/openai.md`` is rendered
from it (``python -m cluster.edge.openai_fields``). ``tests/cluster/edge/test_openai_contract.py`` walks
the installed ``openai`` package's request types: a field added upstream fails that test until it
is given a treatment here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic_core import PydanticCustomError


class Treatment(StrEnum):
    WORKS = "works"
    INFORMS = "accepted, informational"
    REFUSED = "refused (400)"


@dataclass(frozen=True, slots=True)
class FieldTreatment:
    treatment: Treatment
    note: str


def works(note: str) -> FieldTreatment:
    return FieldTreatment(Treatment.WORKS, note)


def informs(note: str) -> FieldTreatment:
    return FieldTreatment(Treatment.INFORMS, note)


def refused(reason: str) -> FieldTreatment:
    return FieldTreatment(Treatment.REFUSED, reason)


FUNCTIONS = "the deprecated `functions` API is not supported: send `tools` (docs/openai.md, tool calls)"
_FUNCTIONS = refused(FUNCTIONS + ' (absent, `null`, an empty list and `"none"` are accepted)')
_OWN_CACHE = (
    "no effect: the replicas' prefix cache finds a tenant's repeated prompt blocks by their content "
    "(`docs/engine.md`, prefix caching), without keys, breakpoints or retention"
)
_NO_AUDIO = "audio is not supported: the served models read and write text only"

# Fields both endpoints share, with the same treatment.
COMMON: dict[str, FieldTreatment] = {
    "model": works(
        "a served model's name, or a LoRA adapter's the caller is granted (`GET /v1/models`); another "
        "name is a 404 `model_not_found`"
    ),
    "stream": works("server-sent events, `data: [DONE]` last"),
    "stream_options": works("see the `stream_options` table"),
    "temperature": works("0-2; 0 is greedy; left out: the checkpoint's `generation_config.json`, else 1"),
    "top_p": works("(0, 1]; left out: the checkpoint's value, else 1"),
    "n": works("choices per prompt, sharing the prompt's KV cache; at most `max_n` (400 above)"),
    "seed": works("reproducible sampling at any load"),
    "stop": works("up to 4 strings of at most 256 characters; `null` is none"),
    "presence_penalty": works("[-2, 2], OpenAI's rule over the output so far"),
    "frequency_penalty": works("[-2, 2], OpenAI's rule over the output so far"),
    "logit_bias": works(
        "token id (string) -> bias in [-100, 100], 300 entries; ids outside the vocabulary: 400"
    ),
    "user": informs(
        "recorded in the request's timing record (`GET /admin/timings`, field `user`), beside its "
        "tenant; up to 256 characters"
    ),
}

# vLLM's extra sampling fields, on both endpoints (not in OpenAI's types).
VLLM_EXTRAS: dict[str, FieldTreatment] = {
    "top_k": works("vLLM: the k most likely tokens only (-1, 0: off)"),
    "min_p": works("vLLM: drop tokens below min_p x the top probability"),
    "repetition_penalty": works("vLLM: (0, 10], 1 is off"),
    "min_tokens": works("vLLM: no EOS, stop id or stop string before this many"),
    "stop_token_ids": works("vLLM: up to 16 more token ids that end a choice"),
    "ignore_eos": works("vLLM: keep generating past EOS (benchmarks)"),
    "cache_salt": works(
        "vLLM: mixed into the prefix cache's keys: only requests of the same tenant (or cache group) "
        "with the same salt share cached prompt blocks; up to 256 characters"
    ),
}

CHAT: dict[str, FieldTreatment] = {
    **COMMON,
    "messages": works("see the message and content-part tables; rendered with the model's chat template"),
    "max_completion_tokens": works("the answer's cap (wins over `max_tokens`)"),
    "max_tokens": works(
        "the answer's cap; left out: the rest of the context, capped by `chat_default_max_tokens`, the "
        "checkpoint's `max_new_tokens` and the tenant's own limits (`max_tokens_per_request`, its "
        "context), so a call that names no length is never refused for one; an explicit value above "
        "the tenant's cap is a 400"
    ),
    "logprobs": works(
        "the chosen tokens' logprobs (the model's own distribution; a value that is not a finite "
        "number is sent as -9999.0, as vLLM does, so every body and chunk is strict JSON)"
    ),
    "top_logprobs": works("0-20 alternatives per token; needs `logprobs: true`"),
    "metadata": informs(
        "checked as OpenAI does (16 pairs, keys 64 and values 512 characters) and stored nowhere"
    ),
    "store": informs("fairlane stores no completions whatever it says; nothing to list or fetch later"),
    "service_tier": informs(
        "no effect: the tenant's SLA class (`docs/tenancy.md`) sets its priority; "
        "the answer has no `service_tier`"
    ),
    "prompt_cache_key": informs(_OWN_CACHE),
    "prompt_cache_retention": informs(_OWN_CACHE),
    "prompt_cache_options": informs(_OWN_CACHE),
    "safety_identifier": informs("no effect and stored nowhere (fairlane runs no abuse checks on it)"),
    "verbosity": informs("no effect: the answer's length is the model's and `max_tokens`'"),
    "reasoning_effort": informs("no effect: the served models' chat templates get no reasoning switch"),
    "prediction": informs(
        "no effect on the answer (a predicted output only speeds OpenAI's decoding up; "
        "fairlane does not use it)"
    ),
    "modalities": works('`["text"]` works; `"audio"`: 400 (' + _NO_AUDIO + ")"),
    "audio": refused(_NO_AUDIO),
    "moderation": refused("moderation is not available on this server"),
    "web_search_options": refused("web search is not available on this server"),
    "response_format": works(
        '`{"type": "text"}`; `"json_object"` (any JSON object); `"json_schema"` (the answer matches '
        "`json_schema.schema`, by grammar-constrained decoding; `strict` is accepted and always holds); "
        "a schema that breaks its metaschema or has a `$ref` that resolves nowhere: 400, `param` "
        '"response_format.json_schema.schema", a JSON pointer in the message'
    ),
    "tools": works(
        "function tools, at most 128, unique names; `parameters` is a JSON Schema checked as "
        "`response_format`'s (a bad one: 400, `param` `tools.<i>.function.parameters`, a JSON pointer "
        "in the message); rendered by the model's chat template, or a system prompt where the template "
        "has no tools (see Tool calls)"
    ),
    "tool_choice": works(
        '`"auto"` (the model decides, the answer is parsed), `"none"` (no tools in the prompt), '
        '`"required"` and `{"type": "function", "function": {"name": ...}}` (enforced by '
        "grammar-constrained decoding); a name not in `tools`, or `required`/named without tools: 400"
    ),
    "parallel_tool_calls": works(
        "default true; false: one call at most (`required` then asks for exactly one)"
    ),
    "functions": _FUNCTIONS,
    "function_call": _FUNCTIONS,
    **VLLM_EXTRAS,
}

COMPLETIONS: dict[str, FieldTreatment] = {
    **COMMON,
    "prompt": works(
        "text, token ids, or a list of either (a batch, 32 prompts at most): each prompt is its own "
        "request for quotas and the fair queue, answered together; choice index = prompt index x n + choice"
    ),
    "max_tokens": works(
        "the answer's cap (default 16, or the checkpoint's, within the tenant's cap); 0 only with `echo` "
        "(scoring)"
    ),
    "logprobs": works("0-20 top logprobs per token, OpenAI's legacy shape"),
    "echo": works("the prompt before the answer (with `logprobs`, its logprobs, the first null)"),
    "best_of": works(
        "best_of >= n choices are generated and the n with the highest cumulative logprob returned, best "
        "first (as vLLM); usage counts every generated token; not with `stream` (400, as OpenAI)"
    ),
    "response_format": works("as on chat: an extension (vLLM takes it too); not in OpenAI's completions"),
    "suffix": refused("suffix (insertion) is not supported: the served models only continue text"),
    **VLLM_EXTRAS,
}

STREAM_OPTIONS: dict[str, FieldTreatment] = {
    "include_usage": works("a last chunk with no choices and the request's usage, before `[DONE]`"),
    "continuous_usage_stats": works(
        "vLLM: with `include_usage`, every chunk carries usage too "
        "(its prompt's tokens, its choice's tokens so far)"
    ),
    "include_obfuscation": informs("no effect: fairlane adds no `obfuscation` field to chunks"),
}

MESSAGE: dict[str, FieldTreatment] = {
    "role": works(
        "`developer` (as `system`), `system`, `user`, `assistant`, `tool` (answers a call by "
        '`tool_call_id`); `function`: 400 ("' + FUNCTIONS + '")'
    ),
    "content": works(
        "text, or a list of content parts; `null` only on an assistant message (rendered empty)"
    ),
    "name": works("passed to the chat template with the message (most templates leave it out)"),
    "refusal": informs("an assistant message's earlier refusal: rendered as its content when it has none"),
    "audio": refused(_NO_AUDIO),
    "tool_calls": works(
        "an assistant's earlier calls (`content` may be null), arguments a JSON object as text; each "
        "is answered by a `tool` message before the next other message, else 400"
    ),
    "function_call": _FUNCTIONS,
    "tool_call_id": works("on `tool` messages only: the call it answers (one that is open, else 400)"),
}

CONTENT_PARTS: dict[str, FieldTreatment] = {
    "text": works(
        "its text; parts are joined in order; `prompt_cache_breakpoint` has no effect "
        "(the prefix cache needs no breakpoints)"
    ),
    "refusal": works("on assistant messages: its text, as a text part"),
    "image_url": refused("image input is not supported: the served models read text only"),
    "input_audio": refused(_NO_AUDIO),
    "file": refused("file input is not supported: the served models read text only"),
    "video_url": refused("video input is not supported: the served models read text only"),
    "audio_url": refused(_NO_AUDIO),
}

TABLES: dict[str, dict[str, FieldTreatment]] = {
    "POST /v1/chat/completions": CHAT,
    "POST /v1/completions": COMPLETIONS,
    "stream_options (both)": STREAM_OPTIONS,
    "chat message fields": MESSAGE,
    "chat content parts (by `type`)": CONTENT_PARTS,
}


def refusal(field: str, table: dict[str, FieldTreatment] = CHAT) -> PydanticCustomError:
    """The 400 for a refused field, with the table's reason (the error's `param` is the field)."""
    reason = table[field].note if table[field].treatment is Treatment.REFUSED else field
    return PydanticCustomError("unsupported_parameter", reason)


def unsupported(reason: str) -> PydanticCustomError:
    """The 400 for a value a field cannot take here (an image part, audio output)."""
    return PydanticCustomError("unsupported_value", reason)


def markdown() -> str:
    """The tables as ``docs/openai.md`` shows them."""
    out = []
    for title, table in TABLES.items():
        out += [f"### {title}", "", "| field | treatment | what fairlane does |", "|---|---|---|"]
        out += [f"| `{name}` | {t.treatment} | {t.note} |" for name, t in table.items()]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
