"""A replica's side of direct dispatch: routers hand it requests on a TCP connection, not Serve calls.

With ``direct_dispatch`` a request costs a router no Serve call: each router keeps one connection
to each replica (``cluster/routing/direct_dispatch.py``) and writes, once per event-loop tick, one
frame with every request it sent that replica in that tick. The replica runs each request as
``generate_channel`` does (outputs on the router's stream channel, ``stream_channel.py``) and answers
on this connection with the same answer the Serve call would return, batched the same way.

Frames (``stream_frames.py``: a 4-byte length, then orjson). The first one from the router is the
replica's key (published with its load on the replica board, which only the cluster's processes
read), read with a small bound and a deadline and compared in constant time (``frame_hello.py``).
Then router → replica: a list of ``["generate", args]`` (``GenerateArgs.as_wire``) and
``["cancel", request_id]`` and ``["stats", tag]`` (the replica's load and prefix-cache summary, for
the router's replica choice); replica → router: a list of ``[request_id, answer]``.

A request ends exactly once: its answer is written, or the router cancelled it (the engine request
is aborted), or the connection ended (every request of that router is cancelled: it is gone, and
its clients with it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from cluster.serving.frame_hello import HELLO_TIMEOUT_S, read_hello
from cluster.serving.stream_frames import FrameError, encode, read_frame
from cluster.serving.wire import GenerateArgs, error_item

log = logging.getLogger(__name__)

Run = Callable[[GenerateArgs], Awaitable[dict[str, Any]]]
Stats = Callable[[], dict[str, Any]]


class SubmitServer:
    """Listens for routers; runs what they send with ``run`` and answers on the same connection."""

    def __init__(self, run: Run, stats: Stats, hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        """``run``: one request, answered as ``generate_channel`` answers; ``stats``: the replica's
        routing stats, which a router asks for on its connection (``["stats", tag]``);
        ``hello_timeout_s``: how long a new connection may take to send its key (``frame_hello``)."""
        self._run = run
        self._stats = stats
        self.key = secrets.token_hex(16)
        self.address = ""
        self.hello_timeout_s = hello_timeout_s
        self._server: asyncio.Server | None = None
        self._links: set[_RouterLink] = set()
        self.received = 0  # requests and frames read: the tests' view of batching
        self.frames = 0

    async def start(self, host: str = "127.0.0.1") -> None:
        self._server = await asyncio.start_server(self._serve, host, 0)
        self.address = f"{host}:{self._server.sockets[0].getsockname()[1]}"

    @property
    def in_flight(self) -> int:
        return sum(len(link.tasks) for link in self._links)

    async def drain(self, timeout_s: float) -> None:
        """Stop taking requests and wait up to ``timeout_s`` for those running to end."""
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _RouterLink(writer)
        self._links.add(link)
        try:
            await read_hello(reader, self.key, self.hello_timeout_s)  # small, timed, constant-time
            while True:
                ops = await read_frame(reader)
                self.frames += 1
                for op, value in ops:
                    if op == "generate":
                        self.received += 1
                        link.start(GenerateArgs.from_wire(value), self._run)
                    elif op == "cancel":
                        link.cancel(value)
                    elif op == "stats":
                        link.answer(value, self._stats())
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, TypeError) as exc:
            if isinstance(exc, FrameError | ValueError | TypeError):
                log.warning("submit connection dropped: %r", exc)
        finally:
            self._links.discard(link)
            link.close()


class _RouterLink:
    """One router's connection: its running requests and the answers waiting for this tick's frame."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self.tasks: dict[str, asyncio.Task] = {}
        self._answers: list[list[Any]] = []
        self._closed = False

    def start(self, args: GenerateArgs, run: Run) -> None:
        if args.request_id in self.tasks:  # a duplicate id would orphan the first: refuse the second
            self.answer(args.request_id, error_item("invalid_request", "duplicate request id"))
            return
        task = asyncio.get_running_loop().create_task(run(args))
        self.tasks[args.request_id] = task
        task.add_done_callback(lambda done, rid=args.request_id: self._finished(rid, done))

    def cancel(self, request_id: str) -> None:
        task = self.tasks.pop(request_id, None)
        if task is not None:
            task.cancel()  # generate_channel's stream closes: the engine aborts the request

    def _finished(self, request_id: str, task: asyncio.Task) -> None:
        if self.tasks.get(request_id) is task:
            del self.tasks[request_id]
        if task.cancelled():
            return  # the router cancelled it, or is gone: nobody waits for an answer
        exc = task.exception()
        answer = task.result() if exc is None else error_item("engine_error", f"replica error: {exc!r}")
        self.answer(request_id, answer)

    def answer(self, request_id: str, answer: dict[str, Any]) -> None:
        if self._closed:
            return
        if not self._answers:  # the first answer of this tick schedules the tick's one write
            asyncio.get_running_loop().call_soon(self._flush)
        self._answers.append([request_id, answer])

    def _flush(self) -> None:
        answers, self._answers = self._answers, []
        if answers and not self._closed:
            self._writer.write(encode(answers))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()
        self._writer.close()
