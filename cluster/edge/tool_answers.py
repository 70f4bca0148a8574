"""Tool calls in the answer: the model's text read by its family's parser, written as OpenAI writes calls.

A collected answer's message gets ``tool_calls`` (``{"id": "call_...", "type": "function",
"function": {"name", "arguments"}}``) and the text outside the calls as ``content`` (null when only
calls were made); a stream's chunks get OpenAI's deltas: a call's first delta carries its ``index``,
``id``, ``type`` and ``function.name``, later ones pieces of ``function.arguments``; content before
a call streams as content. ``finish_reason`` is ``"tool_calls"`` when a choice that made calls ended
by itself (``"length"`` stays: its last call may be cut short). With ``parallel_tool_calls: false``
only a choice's first call is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from cluster.edge.openai_schemas import ChatCompletionRequest
from cluster.text.tool_call_scanner import CallDelta, Content, Event
from cluster.text.tool_parsers import Family, ToolParser, new_parser, parse_all


@dataclass(frozen=True, slots=True)
class ToolPlan:
    parser_family: Family | Literal["forced"]
    parallel: bool

    def parser(self) -> ToolParser:
        return new_parser(self.parser_family)

    def rewrite(self, body: dict[str, Any]) -> dict[str, Any]:
        """A collected chat answer with each choice's calls read out of its text."""
        for choice in body["choices"]:
            message = choice["message"]
            content, calls = parse_all(self.parser(), message["content"] or "")
            calls = calls if self.parallel else calls[:1]
            message["content"] = content if content or not calls else None
            if calls:
                message["tool_calls"] = [_call(c["id"], c["name"], c["arguments"]) for c in calls]
                choice["finish_reason"] = _finish(choice["finish_reason"])
        return body


def tool_plan(body: ChatCompletionRequest, family: Family) -> ToolPlan | None:
    """How the request's answer is read: None when it asked for no tools (its text is the answer)."""
    if body.tool_mode == "off":
        return None
    return ToolPlan("forced" if body.tool_mode == "forced" else family, body.parallel_calls)


@dataclass
class ChunkShaper:
    """Rewrites a chat stream's chunks, one parser per choice; a chunk left with nothing to say
    (its text held back, a tag's start perhaps) is dropped."""

    plan: ToolPlan
    _parsers: dict[int, ToolParser] = field(default_factory=dict)
    _called: set[int] = field(default_factory=set)

    def __call__(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        choice = chunk["choices"][0]
        index = choice["index"]
        parser = self._parsers.setdefault(index, self.plan.parser())
        delta = choice["delta"]
        events = parser.feed(delta.get("content") or "")
        if choice["finish_reason"] is not None:
            events += parser.finish()
        content, calls = _pieces(events, self.plan.parallel)
        if calls:
            self._called.add(index)
        new_delta: dict[str, Any] = {k: v for k, v in delta.items() if k == "role"}
        if content or not calls:
            new_delta["content"] = content
        if calls:
            new_delta["tool_calls"] = calls
        finish = choice["finish_reason"]
        if finish is not None and index in self._called:
            finish = _finish(finish)
        quiet = not content and not calls and "role" not in delta and finish is None
        if quiet and choice.get("logprobs") is None and "usage" not in chunk:
            return []
        return [{**chunk, "choices": [{**choice, "delta": new_delta, "finish_reason": finish}]}]


def _pieces(events: list[Event], parallel: bool) -> tuple[str, list[dict[str, Any]]]:
    """The events' content, and their call deltas (pieces of one call next to each other merged)."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, Content):
            content.append(event.text)
            continue
        if not parallel and event.index > 0:
            continue
        if calls and calls[-1]["index"] == event.index:
            calls[-1]["function"]["arguments"] += event.arguments
            continue
        calls.append(_delta(event))
    return "".join(content), calls


def _delta(event: CallDelta) -> dict[str, Any]:
    if event.id is None:
        return {"index": event.index, "function": {"arguments": event.arguments}}
    return {"index": event.index, **_call(event.id, event.name or "", event.arguments)}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _finish(finish: str | None) -> str | None:
    return "tool_calls" if finish == "stop" else finish
