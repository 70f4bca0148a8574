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

Each read of a connection takes every byte already there, so frames that arrived together (the
router fell behind a replica's flushes) are handled together: an output whose stream has another
one later in the same read is marked ``more_coming`` while its sink runs, and a pushed stream holds
its SSE event until that later output, then writes them in one socket write (``ClientWriter``).
Nothing waits for bytes not yet read: the last output of each stream in the read goes at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import Any

import orjson

from cluster.serving.frame_hello import HELLO_TIMEOUT_S, read_hello
from cluster.serving.stream_frames import HEADER, MAX_FRAME_BYTES, FrameError

log = logging.getLogger(__name__)
READ_BYTES = 1 << 20  # the most taken off a connection per read (frames split across reads join)


class BadFrame(FrameError):
    """A frame that cannot be one of ours, after ``before``: the frames complete ahead of it in the
    same bytes, still to deliver (read a frame at a time, they would have been)."""

    def __init__(self, reason: str, before: list[Any]) -> None:
        super().__init__(reason)
        self.before = before


class FrameBuffer:
    """The stream channel's frames (``stream_frames``: a 4-byte length, then an orjson array) from
    a connection's bytes as they come; a frame split across reads waits for its rest."""

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> list[Any]:
        """The payload of every frame that ``data`` completes, in order. ``BadFrame`` for a length
        over the limit (from the header alone, before its body came) or a body that is not JSON."""
        buf = self._buf
        buf += data
        frames: list[Any] = []
        at, size_of = 0, HEADER.size
        with memoryview(buf) as view:
            while len(buf) - at >= size_of:
                (size,) = HEADER.unpack_from(buf, at)
                if size > self._limit:
                    raise BadFrame(f"frame of {size} bytes", frames)
                end = at + size_of + size
                if end > len(buf):
                    break
                try:
                    frames.append(orjson.loads(view[at + size_of : end]))
                except orjson.JSONDecodeError as exc:
                    raise BadFrame("frame is not JSON", frames) from exc
                at = end
        del buf[:at]
        return frames


class StreamReceiver:
    """Listens for replicas' channels; routes each output to its request's queue."""

    def __init__(self, hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        """``hello_timeout_s``: how long a new connection may take to send its key (``frame_hello``)."""
        self.key = secrets.token_hex(16)
        self.address = ""
        self.hello_timeout_s = hello_timeout_s
        # Each open request's sink: its queue's put (pulled streams) or its push handler.
        self._sinks: dict[str, Callable[[Any], None]] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.frames = 0  # frames and outputs read: the benchmark's and the tests' view of batching
        self.outputs = 0
        # While a sink runs: whether its stream has another output later in the same read.
        self.more_coming = False

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
        self._sinks[request_id] = queue.put_nowait
        return ChannelStream(self, request_id, queue, response)

    def redirect(self, request_id: str, sink: Callable[[Any], None]) -> None:
        """Send the request's further outputs to ``sink`` (when it is still open)."""
        if request_id in self._sinks:
            self._sinks[request_id] = sink

    def forget(self, request_id: str) -> None:
        """Outputs still arriving for the request are dropped (it ended, or a retry replaced it)."""
        self._sinks.pop(request_id, None)

    @property
    def open_streams(self) -> int:
        return len(self._sinks)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            await read_hello(reader, self.key, self.hello_timeout_s)  # small, timed, constant-time
            frames = FrameBuffer()
            while data := await reader.read(READ_BYTES):
                self._deliver(frames.feed(data))
        except BadFrame as exc:
            log.warning("stream channel dropped: %s", exc)
            self._deliver(exc.before)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if isinstance(exc, FrameError):
                log.warning("stream channel dropped: %s", exc)
        finally:
            self._connections.discard(writer)
            writer.close()

    def _deliver(self, frames: list[Any]) -> None:
        """Every output of ``frames`` to its sink, in order. Pushed outputs are rendered and written
        right here, with no yield inside: a yield every 16 outputs sent this connection to the back
        of the loop's queue 8 times a 128-stream frame, its reads fell behind the replica's flushes,
        and token lateness p99 went from 76 to 610 ms (H200 host, 512 streams)."""
        items = frames[0] if len(frames) == 1 else [item for frame in frames for item in frame]
        self.frames += len(frames)
        self.outputs += len(items)
        last = {item["request_id"]: i for i, item in enumerate(items)}  # each stream's last output
        sinks = self._sinks
        try:
            for i, item in enumerate(items):
                request_id = item["request_id"]
                sink = sinks.get(request_id)
                if sink is not None:
                    self.more_coming = last[request_id] != i
                    sink(item)
        finally:
            self.more_coming = False


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Timeout:
    """A wait's timer fired; only the marker of the current wait ends it."""

    __slots__ = ()


class ChannelStream:
    """One request's outputs from the channel, ended by its Serve call's answer when that is an error.

    Pulled (``next``, ``__anext__``) from a queue, or pushed (``push``): each output then goes to a
    callback right where the receiver reads its frame, with no queue, task wake or generator per
    output. An error answer comes after the tokens written before it either way."""

    def __init__(
        self, receiver: StreamReceiver, request_id: str, queue: asyncio.Queue, response: Any
    ) -> None:
        self._receiver = receiver
        self._request_id = request_id
        self._queue = queue
        self._put: Callable[[Any], None] = queue.put_nowait
        self._response = response
        self._tokens = 0  # read so far: an error answer waits for the tokens written before it
        self._error: dict[str, Any] | None = None
        self._on_item: Callable[[dict[str, Any]], None] | None = None
        self._on_failure: Callable[[Exception], None] | None = None
        self._watch = asyncio.get_running_loop().create_task(self._await_answer())

    async def _await_answer(self) -> None:
        """The call's answer: ``{"ok": True}`` after the last output was written (nothing to do: the
        output that ends the request is on the channel), an error item, or the call's failure."""
        try:
            answer = await self._response
        except asyncio.CancelledError:
            return
        except Exception as exc:  # the replica died, or Serve could not route: request_flow decides
            self._put(_Failed(exc))
            return
        if isinstance(answer, dict) and "error" in answer:
            self._error = answer
            self._release_error()

    def _release_error(self) -> None:
        if self._error is not None and self._tokens >= self._error.get("after_tokens", 0):
            error, self._error = self._error, None
            self._put(error)

    def push(
        self, on_item: Callable[[dict[str, Any]], None], on_failure: Callable[[Exception], None]
    ) -> None:
        """From now on, hand each output to ``on_item`` as it arrives (outputs already queued
        first), or the call's failure to ``on_failure``; nothing comes after the stream's end."""
        self._on_item, self._on_failure = on_item, on_failure
        self._put = self._pushed
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if type(item) is not _Timeout:
                self._pushed(item)
        self._receiver.redirect(self._request_id, self._pushed)

    def _pushed(self, item: Any) -> None:
        on_item, on_failure = self._on_item, self._on_failure
        if on_item is None or on_failure is None:  # cancelled, or already ended (set together)
            return
        try:
            taken = self._take(item)
        except Exception as exc:  # the Serve call failed (``_Failed`` holds an Exception)
            self._on_item = self._on_failure = None
            on_failure(exc)
            return
        if taken.get("done") or "error" in taken:
            self._on_item = self._on_failure = None  # nothing after the end
        on_item(taken)
        self._release_error()

    def __aiter__(self) -> ChannelStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while True:
            item = await self._queue.get()
            if type(item) is not _Timeout:  # an earlier wait's marker is skipped
                return self._taken(item)

    async def next(self, timeout_s: float) -> dict[str, Any]:
        """``__anext__`` within ``timeout_s`` (``TimeoutError``), without ``asyncio.wait_for``'s task
        per call: a timer puts a marker in the queue; a marker of an earlier wait is skipped."""
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if type(item) is not _Timeout:
                return self._taken(item)
        marker = _Timeout()
        timer = asyncio.get_running_loop().call_later(timeout_s, self._queue.put_nowait, marker)
        try:
            while True:
                item = await self._queue.get()
                if type(item) is not _Timeout:
                    return self._taken(item)
                if item is marker:
                    raise TimeoutError
        finally:
            timer.cancel()

    def _taken(self, item: Any) -> dict[str, Any]:
        taken = self._take(item)
        self._release_error()
        return taken

    def _take(self, item: Any) -> dict[str, Any]:
        if isinstance(item, _Failed):
            self._receiver.forget(self._request_id)
            raise item.exc
        if item.get("done") or "error" in item:
            self._receiver.forget(self._request_id)
        else:
            self._tokens += len(item["token_ids"])
        return item

    @property
    def more_coming(self) -> bool:
        """While an output is pushed: another output of this stream comes later in the same read."""
        return self._receiver.more_coming

    def cancel(self) -> None:
        """Stop the request: Serve cancels the replica's call, which aborts the engine request."""
        self._on_item = self._on_failure = None
        self._receiver.forget(self._request_id)
        self._response.cancel()
        self._watch.cancel()
