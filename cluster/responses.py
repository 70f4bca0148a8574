"""OpenAI response bodies and server-sent-event chunks for completions and chat completions."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import StreamingResponse

from cluster.errors import classify, error_body
from cluster.openai_schemas import usage

Kind = Literal["completion", "chat"]
FINISH = {"stop": "stop", "length": "length"}


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    kind: Kind
    response_id: str
    model: str
    created: int

    @classmethod
    def new(cls, kind: Kind, request_id: str, model: str) -> ResponseMeta:
        prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
        return cls(kind, prefix + request_id, model, int(time.time()))


def full_body(
    meta: ResponseMeta, text: str, finish_reason: str | None, prompt_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """The non-streamed response."""
    finish = FINISH.get(finish_reason or "", "stop")
    if meta.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    return {
        "id": meta.response_id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, output_tokens),
    }


def chunk(meta: ResponseMeta, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
    """One streamed chunk with a text delta (and the role on a chat stream's first chunk)."""
    finish = None if finish_reason is None else FINISH.get(finish_reason, "stop")
    if meta.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    else:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    return {
        "id": meta.response_id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    }


def usage_chunk(meta: ResponseMeta, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The final chunk OpenAI sends with ``stream_options.include_usage``: no choices, only usage."""
    obj = "text_completion" if meta.kind == "completion" else "chat.completion.chunk"
    return {
        "id": meta.response_id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage(prompt_tokens, output_tokens),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def sse_stream(
    meta: ResponseMeta, outputs: AsyncIterator[dict[str, Any]], include_usage: bool
) -> AsyncIterator[bytes]:
    """Chunks for every output, the usage chunk when asked, then ``data: [DONE]``.

    The last output's chunk, the usage chunk and ``[DONE]`` leave as one piece: each piece is one
    ASGI message through Serve (router → proxy hop, one socket write), the per-request cost that
    bounds a router's requests per second. The bytes on the wire are the same.
    """
    first, ended = True, False
    prompt_tokens = output_tokens = 0
    async for item in outputs:  # pulled to its end: that is where the request is closed as "ok"
        prompt_tokens, output_tokens = item["num_prompt_tokens"], item["num_output_tokens"]
        if item["finish_reason"] is not None:
            last = sse(chunk(meta, item["text"], item["finish_reason"], first))
            yield last + _tail(meta, prompt_tokens, output_tokens, include_usage)
            first, ended = False, True
        elif item["text"] or first:
            yield sse(chunk(meta, item["text"], None, first))
            first = False
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
