"""OpenAI response bodies and server-sent-event chunks for completions and chat completions.

A request of n choices streams each choice's deltas under its `index` (the role on each choice's
first chat chunk) and ends with each choice's finish reason; the usage chunk and ``[DONE]`` follow
when every choice has ended. Logprobs (and a completion's echoed prompt) ride on the same chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.responses import StreamingResponse

from cluster.edge.logprobs_format import (
    CompletionLogprobs,
    TokenText,
    chat_logprobs,
    merge_completion_logprobs,
)
from cluster.edge.openai_schemas import usage
from cluster.errors import classify, error_body

Kind = Literal["completion", "chat"]
FINISH = {"stop": "stop", "length": "length"}


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    kind: Kind
    response_id: str
    model: str
    created: int
    logprobs: int | None = None  # top logprobs per token, when the request asked for logprobs
    echo: tuple[str, tuple[int, ...]] | None = None  # a completion's prompt text and ids, echoed

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
    started: bool = False
    finish: str | None = None
    text: list[str] = field(default_factory=list)
    logprob_parts: list = field(default_factory=list)
    _completion: CompletionLogprobs | None = None

    def piece(self, item: dict[str, Any]) -> tuple[str, Any]:
        """This item's text (with the echoed prompt first) and its logprobs in the response's shape."""
        meta = self.meta
        text, tokens, entries = item["text"], list(item["token_ids"]), item.get("logprobs")
        prompt = item.get("prompt_logprobs")
        if not self.started and meta.echo is not None:
            text = meta.echo[0] + text
            if prompt is not None:
                tokens, entries = [*meta.echo[1], *tokens], [*prompt, *(entries or [])]
        self.started = True
        if meta.logprobs is None or entries is None:
            return text, None
        if meta.kind == "chat":
            return text, chat_logprobs(entries, self.token_text, meta.logprobs)
        if self._completion is None:
            self._completion = CompletionLogprobs(self.token_text, meta.logprobs)
        return text, self._completion.block(entries, tokens)

    def add(self, item: dict[str, Any]) -> None:
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


def full_body(meta: ResponseMeta, choices: list[ChoiceState], prompt_tokens: int, output_tokens: int) -> dict:
    """The non-streamed response."""
    body = _envelope(meta, chunked=False)
    body["choices"] = [
        _choice(meta, c.index, "".join(c.text), c.logprobs(), c.finish or "stop", delta=False, first=False)
        for c in choices
    ]
    body["usage"] = usage(prompt_tokens, output_tokens)
    return body


def chunk(meta: ResponseMeta, state: ChoiceState, item: dict[str, Any]) -> dict[str, Any]:
    """One streamed chunk of one choice."""
    first = not state.started
    text, logprobs = state.piece(item)
    body = _envelope(meta, chunked=True)
    body["choices"] = [_choice(meta, state.index, text, logprobs, item["finish_reason"], True, first)]
    return body


def usage_chunk(meta: ResponseMeta, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The final chunk OpenAI sends with ``stream_options.include_usage``: no choices, only usage."""
    body = _envelope(meta, chunked=True)
    body["choices"] = []
    body["usage"] = usage(prompt_tokens, output_tokens)
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def sse_stream(
    meta: ResponseMeta,
    outputs: AsyncIterator[dict[str, Any]],
    include_usage: bool,
    token_text: TokenText = str,
    n: int = 1,
) -> AsyncIterator[bytes]:
    """Chunks for every output, the usage chunk when asked, then ``data: [DONE]``.

    The last output's chunk, the usage chunk and ``[DONE]`` leave as one piece: each piece is one
    ASGI message through Serve (router → proxy hop, one socket write), the per-request cost that
    bounds a router's requests per second. The bytes on the wire are the same.
    """
    states = [ChoiceState(i, meta, token_text) for i in range(n)]
    ended = False
    prompt_tokens = output_tokens = 0
    async for item in outputs:  # pulled to its end: that is where the request is closed as "ok"
        prompt_tokens, output_tokens = item["num_prompt_tokens"], item["total_output_tokens"]
        state = states[item["index"]]
        if item["done"]:
            last = sse(chunk(meta, state, item))
            yield last + _tail(meta, prompt_tokens, output_tokens, include_usage)
            ended = True
        elif item["text"] or not state.started or item["finish_reason"] is not None or "logprobs" in item:
            yield sse(chunk(meta, state, item))
    if not ended:
        yield _tail(meta, prompt_tokens, output_tokens, include_usage)


def _tail(meta: ResponseMeta, prompt_tokens: int, output_tokens: int, include_usage: bool) -> bytes:
    usage_part = sse(usage_chunk(meta, prompt_tokens, output_tokens)) if include_usage else b""
    return usage_part + sse("[DONE]")


async def guarded(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Pass chunks on; an error after the headers went out becomes an OpenAI error event."""
    try:
        async for c in chunks:
            yield c
    except Exception as exc:
        yield sse(error_body(classify(exc)))


class ClosingStreamingResponse(StreamingResponse):
    """A stream that always ends its request: a client gone before the first chunk was pulled
    leaves the body generator unstarted (its ``finally`` never runs), so ``on_close`` runs here."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kw) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
