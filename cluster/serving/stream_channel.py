"""A replica's side of the stream channels: one connection per router, one frame per flush.

A per-request Serve stream costs the router, the replica and Serve a fixed slice of CPU per item,
whatever the item carries. Here a request is one unary Serve call (``ReplicaServer.generate_channel``:
routing, Serve's ongoing-request count, cancellation and replica-death errors stay Serve's), and its
outputs travel on a TCP connection the replica keeps to the router that sent it (``reply_to``): every
``flush_s`` the replica writes one frame carrying every open stream's new outputs for that router.
The router sets ``flush_s`` with each request from its item budget (``request_flow.channel_flush``): 0
while few streams are open, so each engine step's outputs leave in a frame of their own.

Order: a request's outputs are merged per choice while they wait (tokens and text concatenated), and
a choice's newest output moves to the end of the frame, so the output that ends the request is the
last of it. One connection per router and TCP keep every request's outputs in order, each once.
The first output of a request and its last leave at once, in a frame of their own: the other
streams' outputs keep waiting for the tick. (Flushing everything on each first or last output would
make a frame every ~10 ms at a few hundred open streams, each stream's outputs one token each, and the
router pays per output: a socket write to the client, a rendered event.) The others wait at most
``flush_s`` after the last full flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from cluster.serving.stream_frames import encode
from cluster.serving.wire import GenerateArgs, error_item, merge_items

log = logging.getLogger(__name__)


class RouterChannel:
    """The connection to one router, and the outputs waiting for its next flush."""

    def __init__(self, address: str, key: str, flush_s: float) -> None:
        self.address = address
        self._key = key
        self.flush_s = flush_s
        self._pending: dict[tuple[str, int], dict[str, Any]] = {}
        self._now: set[str] = set()  # requests whose pending outputs leave without waiting for the tick
        self._waiters: list[tuple[str, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._urgent: asyncio.Future | None = None
        self._hurried = False
        self._writer: asyncio.StreamWriter | None = None
        self._eof: asyncio.Task | None = None
        self.broken: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    def put(self, item: dict[str, Any], urgent: bool) -> None:
        """Queue an output for the next flush; ``urgent``: its request's outputs leave at once."""
        request_id = item["request_id"]
        key = (request_id, item["index"])
        held = self._pending.pop(key, None)  # popped: the newest output goes last
        self._pending[key] = item if held is None else merge_items(held, item)
        self._wake.set()
        if urgent:
            self._now.add(request_id)
            self._hurry()

    async def flushed(self, request_id: str) -> None:
        """Wait until every output of ``request_id`` queued so far is written; raises if the
        connection failed."""
        if self.broken is not None:
            raise self.broken
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((request_id, waiter))
        self._now.add(request_id)
        self._wake.set()
        self._hurry()
        await waiter

    async def answer(self, request_id: str, error: dict[str, Any] | None, tokens: int) -> dict[str, Any]:
        """A request's answer once its outputs are queued: ``{"ok": True}`` when they are written, or
        its error item with ``after_tokens``, the tokens written before it (the router ends the stream
        with it once it has read those); a failed channel answers with a ``channel_error`` item."""
        try:
            await self.flushed(request_id)
        except (ConnectionError, OSError) as exc:
            return error_item("channel_error", f"the router's stream channel failed: {exc}")
        return {"ok": True} if error is None else {**error, "after_tokens": tokens}

    def _hurry(self) -> None:
        self._hurried = True
        if self._urgent is not None and not self._urgent.done():
            self._urgent.set_result(None)

    def _take(self, everything: bool) -> tuple[list[dict[str, Any]], list[asyncio.Future]]:
        """The outputs for this frame, and the waiters that it satisfies once written: every
        pending output when the tick is due, else only the urgent requests' ones."""
        now, self._now = self._now, set()
        if everything:
            items, self._pending = list(self._pending.values()), {}
            waiters, self._waiters = [w for _, w in self._waiters], []
            return items, waiters
        items = [self._pending.pop(key) for key in [k for k in self._pending if k[0] in now]]
        waiters = [w for request_id, w in self._waiters if request_id in now]
        self._waiters = [(r, w) for r, w in self._waiters if r not in now]
        return items, waiters

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = 0.0  # the last full flush: every output waits at most flush_s after it
        try:
            host, port = self.address.rsplit(":", 1)
            reader, self._writer = await asyncio.open_connection(host, int(port))
            self._writer.write(encode(self._key))
            self._eof = loop.create_task(self._watch_eof(reader))
            while True:
                await self._wake.wait()
                delay = last + self.flush_s - loop.time()
                if delay > 0 and not self._hurried:
                    self._urgent = loop.create_future()
                    await asyncio.wait([self._urgent], timeout=delay)
                self._wake.clear()
                self._hurried = False
                everything = loop.time() >= last + self.flush_s
                items, waiters = self._take(everything)
                if everything:
                    last = loop.time()
                elif self._pending:
                    self._wake.set()  # the rest still leaves at the tick
                if items:
                    self._writer.write(encode(items))
                    await self._writer.drain()
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        except asyncio.CancelledError:
            self._fail(ConnectionError("the channel was closed"))
            raise
        except Exception as exc:  # the router is gone or unreachable: its requests end with an error
            log.warning("stream channel to %s failed: %s", self.address, exc)
            self._fail(exc)

    async def _watch_eof(self, reader: asyncio.StreamReader) -> None:
        """The router writes nothing back: a read returns only when it closed (it stopped or
        restarted), and then the channel is dropped at once rather than at its next write."""
        with contextlib.suppress(Exception):
            await reader.read()
        if self.broken is None:
            self._fail(ConnectionError("the router closed the channel"))
            self._task.cancel()

    def _fail(self, exc: BaseException) -> None:
        if self.broken is not None:
            return
        if not isinstance(exc, OSError):  # what ``forward`` turns into the request's error item
            exc = ConnectionError(repr(exc))
        self.broken = exc
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(exc)
        self._waiters, self._pending = [], {}
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        if self._eof is not None:
            self._eof.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class ChannelSet:
    """A replica's channels, one per router address; a broken one is replaced at its next use, and
    the broken ones of other routers are dropped then."""

    def __init__(self) -> None:
        self._channels: dict[str, RouterChannel] = {}

    def channel(self, address: str, key: str, flush_s: float) -> RouterChannel:
        channel = self._channels.get(address)
        if channel is None or channel.broken is not None:
            for gone in [a for a, c in self._channels.items() if c.broken is not None]:
                del self._channels[gone]  # routers that stopped
            channel = self._channels[address] = RouterChannel(address, key, flush_s)
        channel.flush_s = flush_s  # the newest request's: the router's budget for the streams open now
        return channel

    async def forward(self, args: GenerateArgs, outputs: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        """Send one request's outputs, read from an async iterator of output items, on its router's
        channel; the answer is ``RouterChannel.answer``'s. (The engine's requests take the faster
        way, ``channel_relay.ChannelRelay``; stand-in replicas stream from generators.)"""
        assert args.reply_to is not None and args.channel_key is not None
        channel = self.channel(args.reply_to, args.channel_key, args.flush_s)
        tokens = 0
        error = None
        async with contextlib.aclosing(outputs):  # cancelled: the engine request is aborted
            async for item in outputs:
                if "error" in item:  # the router reads it after the tokens written before it
                    error = item
                    break
                channel.put(item, urgent=tokens == 0 or item["done"])
                tokens += len(item["token_ids"])
        return await channel.answer(args.request_id, error, tokens)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
