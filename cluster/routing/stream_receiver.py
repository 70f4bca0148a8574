"""A router's end of the stream channels: every replica's frames, demultiplexed into per-request queues.

The router listens on a port of its own (on its node's address) and sends that address and a random
key with each request (``GenerateArgs.reply_to``, ``channel_key``); each replica connects once and
then writes one frame per flush with every new output of this router's streams
(``cluster/serving/stream_channel.py``). The request itself is a unary Serve call
(``generate_channel``): Serve routes it, counts it as ongoing until it answers, cancels it when
the client leaves (the replica then aborts the engine request), and fails it when the replica dies.

``ChannelStream`` reads one request's outputs with the interface of Serve's stream
(``__anext__``, ``cancel``), so ``request_flow`` treats both the same: an error answer or a
failed call ends the stream after the outputs that came before it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from cluster.serving.stream_frames import FrameError, read_frame

log = logging.getLogger(__name__)


class StreamReceiver:
    """Listens for replicas' channels; routes each output to its request's queue."""

    def __init__(self) -> None:
        self.key = secrets.token_hex(16)
        self.address = ""
        self._queues: dict[str, asyncio.Queue] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.frames = 0  # frames and outputs read: the benchmark's and the tests' view of batching
        self.outputs = 0

    async def start(self, host: str = "127.0.0.1") -> None:
        """Listen on a free port of ``host`` (the address replicas reach this router at)."""
        self._server = await asyncio.start_server(self._serve, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{host}:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):  # each reader then ends at its next read
            writer.close()

    def open(self, request_id: str, response: Any) -> ChannelStream:
        """The stream of request ``request_id`` (its engine id), answered by Serve call ``response``."""
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        return ChannelStream(self, request_id, queue, response)

    def forget(self, request_id: str) -> None:
        """Outputs still arriving for the request are dropped (it ended, or a retry replaced it)."""
        self._queues.pop(request_id, None)

    @property
    def open_streams(self) -> int:
        return len(self._queues)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            if await read_frame(reader) != self.key:
                raise FrameError("wrong channel key")
            queues = self._queues
            while True:
                items = await read_frame(reader)
                self.frames += 1
                self.outputs += len(items)
                for item in items:
                    queue = queues.get(item["request_id"])
                    if queue is not None:
                        queue.put_nowait(item)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if isinstance(exc, FrameError):
                log.warning("stream channel dropped: %s", exc)
        finally:
            self._connections.discard(writer)
            writer.close()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Timeout:
    """A wait's timer fired; only the marker of the current wait ends it."""

    __slots__ = ()


class ChannelStream:
    """One request's outputs from the channel, ended by its Serve call's answer when that is an error."""

    def __init__(
        self, receiver: StreamReceiver, request_id: str, queue: asyncio.Queue, response: Any
    ) -> None:
        self._receiver = receiver
        self._request_id = request_id
        self._queue = queue
        self._response = response
        self._tokens = 0  # read so far: an error answer waits for the tokens written before it
        self._error: dict[str, Any] | None = None
        self._watch = asyncio.get_running_loop().create_task(self._await_answer())

    async def _await_answer(self) -> None:
        """The call's answer: ``{"ok": True}`` after the last output was written (nothing to do: the
        output that ends the request is on the channel), an error item, or the call's failure."""
        try:
            answer = await self._response
        except asyncio.CancelledError:
            return
        except Exception as exc:  # the replica died, or Serve could not route: request_flow decides
            self._queue.put_nowait(_Failed(exc))
            return
        if isinstance(answer, dict) and "error" in answer:
            self._error = answer
            self._release_error()

    def _release_error(self) -> None:
        if self._error is not None and self._tokens >= self._error.get("after_tokens", 0):
            self._queue.put_nowait(self._error)
            self._error = None

    def __aiter__(self) -> ChannelStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while True:
            item = await self._queue.get()
            if type(item) is not _Timeout:  # an earlier wait's marker is skipped
                return self._take(item)

    async def next(self, timeout_s: float) -> dict[str, Any]:
        """``__anext__`` within ``timeout_s`` (``TimeoutError``), without ``asyncio.wait_for``'s task
        per call: a timer puts a marker in the queue; a marker of an earlier wait is skipped."""
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if type(item) is not _Timeout:
                return self._take(item)
        marker = _Timeout()
        timer = asyncio.get_running_loop().call_later(timeout_s, self._queue.put_nowait, marker)
        try:
            while True:
                item = await self._queue.get()
                if type(item) is not _Timeout:
                    return self._take(item)
                if item is marker:
                    raise TimeoutError
        finally:
            timer.cancel()

    def _take(self, item: Any) -> dict[str, Any]:
        if isinstance(item, _Failed):
            self._receiver.forget(self._request_id)
            raise item.exc
        if item.get("done") or "error" in item:
            self._receiver.forget(self._request_id)
        else:
            self._tokens += len(item["token_ids"])
            self._release_error()
        return item

    def cancel(self) -> None:
        """Stop the request: Serve cancels the replica's call, which aborts the engine request."""
        self._receiver.forget(self._request_id)
        self._response.cancel()
        self._watch.cancel()
