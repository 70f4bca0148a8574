"""An ASGI middleware that answers 413 for request bodies over the configured limit.

A declared ``Content-Length`` over the limit is refused before any byte is read. A body without
one (chunked) is read here up to the limit and refused as soon as it passes it, so an endless
body cannot fill the router's memory; a body within the limit is handed on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.errors import PayloadTooLarge, error_response

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyLimit:
    """Wraps an ASGI app; ``limit()`` is read per request (the router sets it when it starts)."""

    def __init__(self, app: Callable, limit: Callable[[], int | None]) -> None:
        self.app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        limit = self._limit() if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None:
            if length > limit:
                await _refuse(scope, receive, send, limit)
                return
            await self.app(scope, receive, send)
            return
        buffered, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                buffered.append(message)  # a disconnect: let the app see it
                break
            size += len(message.get("body", b""))
            if size > limit:
                await _refuse(scope, receive, send, limit)
                return
            buffered.append(message)
            more = message.get("more_body", False)
        await self.app(scope, _replay(buffered, receive), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


def _replay(messages: list[Message], receive: Callable) -> Callable:
    async def replayed() -> Message:
        return messages.pop(0) if messages else await receive()

    return replayed


async def _refuse(scope: Scope, receive: Callable, send: Callable, limit: int) -> None:
    response = error_response(PayloadTooLarge(f"request body over {limit} bytes", code="body_too_large"))
    await response(scope, receive, send)
