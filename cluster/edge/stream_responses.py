"""The HTTP response of a streamed answer: its outputs written straight to the client's socket as
the router reads them off the stream channel, when it can; else pulled through Starlette's
streaming response, piece by piece through every ASGI layer.

Pushed (``SseResponse`` under Serve's direct ingress, for a single request on the stream channel):
the headers go out through ``send`` (every layer sees the response start), then each output becomes
its SSE bytes (``SseRenderer``) and a chunk on the socket (``ClientWriter``) inside the channel's
frame handler (``PushedOutputs``); the handler's task only waits for the end, and the end goes out
through ``send``. The bytes on the wire are the pulled path's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse

from cluster.edge.client_writer import ClientWriter, client_writer, find_server_cycle
from cluster.edge.responses import SseRenderer, rendered, sse
from cluster.errors import classify, error_body
from cluster.routing.outcomes import ClientGone
from cluster.routing.pushed_outputs import PushedOutputs, can_push

# Streamed answers of this process by path ("pushed", "pulled", or "gone" before the headers): the
# router's state shows them, so a benchmark can tell which path its streams took.
STREAM_PATHS: Counter[str] = Counter()


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


class SseResponse(Response):
    """A streamed answer of ``active`` (an ``ActiveRequest`` or a ``BatchRequest``), rendered by
    ``renderer``; pushed when the server's connection is reachable, else pulled."""

    media_type = "text/event-stream"

    def __init__(self, active: Any, renderer: SseRenderer, headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._active = active
        self._renderer = renderer

    async def __call__(self, scope, receive, send) -> None:
        cycle = find_server_cycle(send) if can_push(self._active) else None
        if cycle is None:
            STREAM_PATHS["pulled"] += 1
            pulled = ClosingStreamingResponse(
                guarded(rendered(self._renderer, self._active.outputs())),
                self._client_gone,
                media_type=self.media_type,
            )
            pulled.raw_headers = self.raw_headers
            await pulled(scope, receive, send)
            return
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            writer = client_writer(cycle)
            # None only for a client that left before the headers (the body has no length, so
            # uvicorn frames it in chunks): the request ends below, as client_gone.
            STREAM_PATHS["pushed" if writer is not None else "gone"] += 1
            last = b""
            if writer is not None:
                last = await self._pushed(writer)
                await writer.close()
            await send({"type": "http.response.body", "body": last, "more_body": False})
        finally:
            await self._client_gone()

    def _client_gone(self) -> Awaitable[None]:
        return self._active.close("aborted", "client_gone")  # a no-op after the request ended

    async def _pushed(self, writer: ClientWriter) -> bytes:
        """Every output written as it arrives; the bytes still to send at the end."""
        renderer, stream = self._renderer, self._active.stream

        def consume(item: dict[str, Any]) -> None:
            if writer.gone:
                raise ClientGone
            # Several outputs of this stream in one read of the channel: one socket write for all.
            writer.write(renderer.render(item), stream.more_coming)

        try:
            await PushedOutputs(self._active, consume).run()
        except ClientGone:
            return b""
        except Exception as exc:
            return sse(error_body(classify(exc)))
        return renderer.tail()
