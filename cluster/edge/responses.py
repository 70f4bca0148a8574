"""OpenAI response bodies and server-sent-event chunks for completions and chat completions.

A request of n choices streams each choice's deltas under its `index` (the role on each choice's
first chat chunk) and ends with each choice's finish reason; the usage chunk and ``[DONE]`` follow
when every choice has ended. Logprobs (and a completion's echoed prompt) ride on the same chunks.
A completions batch numbers its choices prompt by prompt (prompt index × n + choice) and its usage
adds up every prompt's; with vLLM's ``continuous_usage_stats`` each chunk carries its usage so far.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from cluster.edge.logprobs_format import (
    CompletionLogprobs,
    TokenText,
    chat_logprobs,
    merge_completion_logprobs,
)
from cluster.edge.openai_schemas import usage
from cluster.edge.sse_pieces import PlainPieces

Kind = Literal["completion", "chat"]
FINISH = {"stop": "stop", "length": "length"}


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    kind: Kind
    response_id: str
    model: str
    created: int
    logprobs: int | None = None  # top logprobs per token, when the request asked for logprobs
    # A completion's prompts, echoed: each prompt's text and ids, in the batch's order.
    echo: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    continuous_usage: bool = False  # usage on every chunk (vLLM's continuous_usage_stats)
    prompts: int = 1  # a completions batch's prompts

    @classmethod
    def new(cls, kind: Kind, request_id: str, model: str, **kw) -> ResponseMeta:
        prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
        return cls(kind, prefix + request_id, model, int(time.time()), **kw)


@dataclass
class ChoiceState:
    """One choice as it builds up: text so far (collected responses) and its logprob pieces."""

    index: int
    meta: ResponseMeta
    token_text: TokenText
    prompt: int = 0  # its prompt's place in a completions batch
    started: bool = False
    finish: str | None = None
    text: list[str] = field(default_factory=list)
    logprob_parts: list = field(default_factory=list)
    cumulative_logprob: float = 0.0  # of the generated tokens, when they came with logprobs (best_of)
    # Each prompt's scored tokens, shared by its choices: the replica sends them once per request,
    # with its first output, and every choice echoes them.
    prompt_scores: dict[int, list] = field(default_factory=dict)
    _completion: CompletionLogprobs | None = None

    def piece(self, item: dict[str, Any]) -> tuple[str, Any]:
        """This item's text (with the echoed prompt first) and its logprobs in the response's shape."""
        meta = self.meta
        text, tokens, entries = item["text"], list(item["token_ids"]), item.get("logprobs")
        prompt = item.get("prompt_logprobs")
        if prompt is not None:
            self.prompt_scores[self.prompt] = prompt
        elif not self.started:
            prompt = self.prompt_scores.get(self.prompt)
        if not self.started and meta.echo is not None:
            echo_text, echo_ids = meta.echo[self.prompt]
            text = echo_text + text
            if prompt is not None:
                tokens, entries = [*echo_ids, *tokens], [*prompt, *(entries or [])]
        self.started = True
        if meta.logprobs is None or entries is None:
            return text, None
        if meta.kind == "chat":
            return text, chat_logprobs(entries, self.token_text, meta.logprobs)
        if self._completion is None:
            self._completion = CompletionLogprobs(self.token_text, meta.logprobs)
        return text, self._completion.block(entries, tokens)

    def add(self, item: dict[str, Any]) -> None:
        self.cumulative_logprob += sum(entry[1] for entry in item.get("logprobs") or ())
        text, logprobs = self.piece(item)
        self.text.append(text)
        if logprobs is not None:
            self.logprob_parts.append(logprobs)
        if item["finish_reason"] is not None:
            self.finish = item["finish_reason"]

    def logprobs(self) -> dict[str, Any] | None:
        if self.meta.logprobs is None:
            return None
        if self.meta.kind == "chat":
            return {"content": [e for part in self.logprob_parts for e in part["content"]], "refusal": None}
        return merge_completion_logprobs(self.logprob_parts)


def choice_states(meta: ResponseMeta, token_text: TokenText, n: int) -> list[ChoiceState]:
    """Every choice of the request: ``n`` per prompt, numbered prompt by prompt."""
    scores: dict[int, list] = {}
    return [
        ChoiceState(i, meta, token_text, prompt=i // n, prompt_scores=scores) for i in range(meta.prompts * n)
    ]


class UsageTally:
    """The request's usage from its outputs: each prompt's prompt tokens and output so far, added up."""

    def __init__(self) -> None:
        self._prompt: dict[int, int] = {}
        self._output: dict[int, int] = {}
        self._cached: dict[int, int] = {}

    def add(self, item: dict[str, Any]) -> None:
        prompt = item.get("prompt", 0)
        self._prompt[prompt] = item["num_prompt_tokens"]
        self._output[prompt] = item["total_output_tokens"]
        self._cached[prompt] = item.get("num_cached_tokens", 0)

    @property
    def prompt_tokens(self) -> int:
        return sum(self._prompt.values())

    @property
    def output_tokens(self) -> int:
        return sum(self._output.values())

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (OpenAI's prompt_tokens_details.cached_tokens)."""
        return sum(self._cached.values())


def _choice(
    meta: ResponseMeta, index: int, text: str, logprobs: Any, finish: str | None, delta: bool, first: bool
):
    finish = None if finish is None else FINISH.get(finish, "stop")
    if meta.kind == "completion":
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    if delta:
        body: dict[str, Any] = {"content": text}
        if first:
            body["role"] = "assistant"
        return {"index": index, "delta": body, "logprobs": logprobs, "finish_reason": finish}
    message = {"role": "assistant", "content": text}
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}


def _envelope(meta: ResponseMeta, chunked: bool) -> dict[str, Any]:
    if meta.kind == "completion":
        obj = "text_completion"
    else:
        obj = "chat.completion.chunk" if chunked else "chat.completion"
    return {"id": meta.response_id, "object": obj, "created": meta.created, "model": meta.model}


def full_body(
    meta: ResponseMeta,
    choices: list[ChoiceState],
    prompt_tokens: int,
    output_tokens: int,
    cached_tokens: int = 0,
) -> dict:
    """The non-streamed response."""
    body = _envelope(meta, chunked=False)
    body["choices"] = [
        _choice(meta, c.index, "".join(c.text), c.logprobs(), c.finish or "stop", delta=False, first=False)
        for c in choices
    ]
    body["usage"] = usage(prompt_tokens, output_tokens, cached_tokens)
    return body


def chunk(meta: ResponseMeta, state: ChoiceState, item: dict[str, Any]) -> dict[str, Any]:
    """One streamed chunk of one choice."""
    first = not state.started
    text, logprobs = state.piece(item)
    body = _envelope(meta, chunked=True)
    body["choices"] = [_choice(meta, state.index, text, logprobs, item["finish_reason"], True, first)]
    if meta.continuous_usage:  # as vLLM: its prompt's tokens and its choice's tokens so far
        body["usage"] = usage(
            item["num_prompt_tokens"], item["num_output_tokens"], item.get("num_cached_tokens", 0)
        )
    return body


def usage_chunk(
    meta: ResponseMeta, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The final chunk OpenAI sends with ``stream_options.include_usage``: no choices, only usage."""
    body = _envelope(meta, chunked=True)
    body["choices"] = []
    body["usage"] = usage(prompt_tokens, output_tokens, cached_tokens)
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def _shaped(shape: Callable[[dict[str, Any]], list[dict[str, Any]]] | None, body: dict[str, Any]) -> bytes:
    return b"".join(sse(c) for c in shape(body)) if shape is not None else sse(body)


def _tail(meta: ResponseMeta, tally: UsageTally, include_usage: bool) -> bytes:
    counts = (tally.prompt_tokens, tally.output_tokens, tally.cached_tokens)
    usage_part = sse(usage_chunk(meta, *counts)) if include_usage else b""
    return usage_part + sse("[DONE]")


class SseRenderer:
    """A streamed response's bytes, output by output: each output's chunk (none, or several when
    ``shape`` rewrites it: tool calls, ``tool_answers.ChunkShaper``), then the usage chunk when
    asked and ``data: [DONE]``. The pulled stream (``sse_stream``) and the pushed one
    (``pushed_stream``) both write these bytes.

    The last output's chunk, the usage chunk and ``[DONE]`` leave as one piece: each piece is one
    socket write (and through Serve's proxy one ASGI message), so fewer pieces cost the router less.
    """

    def __init__(
        self,
        meta: ResponseMeta,
        include_usage: bool,
        token_text: TokenText = str,
        n: int = 1,
        shape: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._meta, self._include_usage, self._shape = meta, include_usage, shape
        self._states = choice_states(meta, token_text, n)
        self._tally = UsageTally()
        self.ended = False
        plain = meta.logprobs is None and meta.echo is None and not meta.continuous_usage and shape is None
        self._pieces = PlainPieces(_envelope(meta, chunked=True), meta.kind) if plain else None

    def render(self, item: dict[str, Any]) -> bytes:
        """The bytes of one output (empty when it shows nothing); its last output's include the tail."""
        meta, shape = self._meta, self._shape
        self._tally.add(item)
        state = self._states[item["index"]]
        if item["done"]:
            self.ended = True
            return _shaped(shape, chunk(meta, state, item)) + _tail(meta, self._tally, self._include_usage)
        if self._pieces is not None and state.started and item["finish_reason"] is None and item["text"]:
            return self._pieces.piece(state.index, item["text"])  # the common chunk, pre-serialized
        if item["text"] or not state.started or item["finish_reason"] is not None or "logprobs" in item:
            return _shaped(shape, chunk(meta, state, item))
        return b""

    def tail(self) -> bytes:
        """The usage chunk and ``[DONE]`` of a stream whose outputs ended without a last one."""
        return b"" if self.ended else _tail(self._meta, self._tally, self._include_usage)


def sse_stream(
    meta: ResponseMeta,
    outputs: AsyncIterator[dict[str, Any]],
    include_usage: bool,
    token_text: TokenText = str,
    n: int = 1,
    shape: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
) -> AsyncIterator[bytes]:
    """``SseRenderer``'s pieces for every output pulled from ``outputs``."""
    return rendered(SseRenderer(meta, include_usage, token_text, n, shape), outputs)


async def rendered(renderer: SseRenderer, outputs: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for item in outputs:  # pulled to its end: that is where the request is closed as "ok"
        piece = renderer.render(item)
        if piece:
            yield piece
    if not renderer.ended:
        yield renderer.tail()
