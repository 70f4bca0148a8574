"""Tools in the prompt: through the model's chat template when it knows tools, else a system prompt.

A template that reads ``tools`` (Llama 3.1, Qwen 2.5, Hermes...) gets them as transformers passes
them: ``tools=[{"type": "function", "function": {...}}]``, and the conversation's assistant
``tool_calls`` (arguments as objects) and ``tool`` messages as they are.

A template that does not (SmolLM2's, most base chat templates) gets the fallback: a system prompt
that lists the tools as JSON and shows the call format of the model's parser family, added to the
conversation's system message (or put first when it has none); earlier calls are written into
their assistant message in that format, and tool results become a user message, each result in
``<tool_response>`` tags (consecutive results in one message, so roles still alternate).

The parser family (``tool_parsers.py``) is the configured one, else guessed from the template: one
that writes ``<tool_call>`` is ``hermes``; one that writes ``<|python_tag|>`` or an ``ipython`` role
is ``llama3_json``; any other (and the fallback) is ``hermes``.
"""

from __future__ import annotations

import json
from typing import Any

from cluster.text.chat_template import reads_variable
from cluster.text.tool_parsers import Family

FALLBACK_HEADER = (
    "# Tools\n\nYou may call one or more functions to help with the user's request. The functions "
    "are listed below, one JSON object per line:\n<tools>\n{tools}\n</tools>\n\n"
)
FALLBACK_CALLS: dict[Family, str] = {
    "hermes": (
        "To call a function, answer with one block per call, each holding a JSON object with the "
        "function's name and its arguments:\n<tool_call>\n"
        '{"name": "<function-name>", "arguments": <arguments-object>}\n</tool_call>'
    ),
    "llama3_json": (
        "To call a function, answer with only a JSON object holding the function's name and its "
        'arguments, in this format: {"name": "<function-name>", "parameters": <arguments-object>}; '
        "separate several calls with ;"
    ),
}


def parser_family(template: str | None, configured: str) -> Family:
    if configured in ("hermes", "llama3_json"):
        return configured  # type: ignore[return-value]
    source = template or ""
    if "<tool_call>" in source:
        return "hermes"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    return "hermes"


def template_inputs(
    template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, family: Family
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and extra template arguments that render ``messages`` with ``tools``."""
    if reads_variable(template, "tools"):
        return messages, ({"tools": tools} if tools else {})
    rendered = _history_as_text(messages, family)
    if tools:
        rendered = _with_system(rendered, fallback_prompt(tools, family))
    return rendered, {}


def fallback_prompt(tools: list[dict[str, Any]], family: Family) -> str:
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return FALLBACK_HEADER.format(tools=listing) + FALLBACK_CALLS[family]


def _call_text(call: dict[str, Any], family: Family) -> str:
    function = call["function"]
    if family == "llama3_json":
        return json.dumps({"name": function["name"], "parameters": function["arguments"]}, ensure_ascii=False)
    body = json.dumps({"name": function["name"], "arguments": function["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _history_as_text(messages: list[dict[str, Any]], family: Family) -> list[dict[str, Any]]:
    """Tool calls and results as plain messages, for a template that knows no tools."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            result = f"<tool_response>\n{message['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
            continue
        plain = {k: v for k, v in message.items() if k != "tool_calls"}
        calls = message.get("tool_calls") or []
        if calls:
            texts = [message["content"]] if message["content"] else []
            joiner = "; " if family == "llama3_json" else "\n"
            plain["content"] = "\n".join([*texts, joiner.join(_call_text(c, family) for c in calls)])
        out.append(plain)
    for message in out:
        message.pop("tool_results", None)
    return out


def _with_system(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
