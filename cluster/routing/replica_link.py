"""A router's connection to one replica for direct dispatch (``cluster/serving/submit_server.py``).

Requests sent in one event-loop tick leave as one frame: the first ``submit`` of a tick schedules
the write with ``call_soon``, so a burst of dispatches costs one write and one read on each side.
Each request's answer (``{"ok": true}`` or its error item) resolves its future; the outputs
themselves travel on the router's stream channel as with Serve calls. A failed connection fails
every pending request with ``ConnectionError``, which the request flow treats like a dead replica
(re-dispatched elsewhere before the first token).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from cluster.serving.stream_frames import encode, read_frame
from cluster.serving.wire import GenerateArgs

log = logging.getLogger(__name__)


class ReplicaLink:
    """The connection to one replica: its pending requests and this tick's outgoing operations."""

    def __init__(self, replica_id: str, address: str, key: str) -> None:
        self.replica_id = replica_id
        self.address = address
        self._key = key
        self.pending: dict[str, asyncio.Future] = {}
        self._outbox: list[list[Any]] = []
        self._writer: asyncio.StreamWriter | None = None
        self._tags = itertools.count()
        self.broken: BaseException | None = None
        self.broken_at = 0.0
        self._task = asyncio.get_running_loop().create_task(self._run())

    def submit(self, args: GenerateArgs) -> DirectCall:
        """Send ``args``; the call resolves to the request's answer."""
        future = self._expect(args.request_id)
        self._send(["generate", args.as_wire()])
        return DirectCall(self, args.request_id, future)

    async def stats(self, timeout_s: float) -> dict[str, Any]:
        """The replica's routing stats (``ReplicaServer.routing_stats``)."""
        tag = f"stats:{next(self._tags)}"
        future = self._expect(tag)
        self._send(["stats", tag])
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self.pending.pop(tag, None)

    def cancel(self, request_id: str) -> None:
        """The router gave the request up: the replica aborts it (nothing if it already answered)."""
        if self.pending.pop(request_id, None) is not None and self.broken is None:
            self._send(["cancel", request_id])

    def _expect(self, tag: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            future.set_exception(self.broken)
        else:
            self.pending[tag] = future
        return future

    def _send(self, op: list[Any]) -> None:
        if self.broken is not None:
            return
        if not self._outbox and self._writer is not None:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(op)

    def _flush(self) -> None:
        ops, self._outbox = self._outbox, []
        if ops and self._writer is not None and self.broken is None:
            self._writer.write(encode(ops))

    async def _run(self) -> None:
        try:
            host, port = self.address.rsplit(":", 1)
            reader, self._writer = await asyncio.open_connection(host, int(port))
            self._writer.write(encode(self._key))
            self._flush()  # what was sent while connecting
            while True:
                for tag, answer in await read_frame(reader):
                    future = self.pending.pop(tag, None)
                    if future is not None and not future.done():
                        future.set_result(answer)
        except asyncio.CancelledError:
            self._fail(ConnectionError("the link was closed"))
            raise
        except Exception as exc:  # the replica died or stopped: its requests go elsewhere
            log.info("direct link to replica %s ended: %r", self.replica_id, exc)
            self._fail(exc if isinstance(exc, ConnectionError) else ConnectionError(repr(exc)))

    def _fail(self, exc: BaseException) -> None:
        if self.broken is not None:
            return
        self.broken, self.broken_at = exc, time.monotonic()
        pending, self.pending, self._outbox = self.pending, {}, []
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class DirectCall:
    """One request sent on a link: awaitable for its answer, cancellable as a Serve response is."""

    __slots__ = ("_future", "_link", "_request_id")

    def __init__(self, link: ReplicaLink, request_id: str, future: asyncio.Future) -> None:
        self._link = link
        self._request_id = request_id
        self._future = future

    def __await__(self):
        return self._future.__await__()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the request has ended (answered, failed or cancelled)."""
        self._future.add_done_callback(lambda _: callback())

    def cancel(self) -> None:
        self._link.cancel(self._request_id)
        self._future.cancel()
