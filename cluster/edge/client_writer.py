"""Writing a streamed response's body straight to the client's socket.

Each ASGI ``send`` of a body piece passes every wrapper between the router's app and the HTTP
server: Starlette's two exception layers, fairlane's status counter, Serve's direct-ingress and
request-id layers, then uvicorn's protocol, which frames the piece (chunked encoding) and writes it.
A 512-token answer is ~250 such pieces. Under Serve's direct ingress the router's own uvicorn
server (its httptools protocol) holds the connection, on the router's event loop: once the
response's headers went out through the chain, ``ClientWriter`` frames and writes body pieces
the way that protocol does, without the wrappers (none of which looks at body pieces). The last
piece still goes through ``send``, so every layer sees the response end.

Pieces of one stream that are ready together (its outputs that came in one read of the stream
channel, ``StreamReceiver``) leave in one transport write, each still its own chunk and its own
SSE event: a socket write per token was most of the pushed path's CPU (py-spy, CPU box).

Found only when the innermost ``send`` is that protocol's (``find_server_cycle``); through Serve's
proxy, or another server, there is none and the caller streams through ``send`` as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

CYCLE_CLASS = ("uvicorn.protocols.http.httptools_impl", "RequestResponseCycle")
SEARCH_DEPTH = 12  # wrappers between the app's send and the server's (7 under Serve 2.60)


def find_server_cycle(send: Callable) -> Any | None:
    """The uvicorn request cycle whose ``send`` the chain of wrappers around ``send`` ends in:
    each wrapper is a closure that holds the next ``send``, so a breadth-first walk of closure
    cells finds the bound method at the chain's end."""
    frontier, seen = [send], {id(send)}
    for _ in range(SEARCH_DEPTH):
        following = []
        for fn in frontier:
            owner = getattr(fn, "__self__", None)
            if owner is not None and (type(owner).__module__, type(owner).__qualname__) == CYCLE_CLASS:
                return owner
            for cell in getattr(getattr(fn, "__func__", fn), "__closure__", None) or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if callable(value) and id(value) not in seen:
                    seen.add(id(value))
                    following.append(value)
        frontier = following
    return None


def client_writer(cycle: Any) -> ClientWriter | None:
    """A writer for ``cycle``'s body once its response started, when the server writes the body in
    chunked encoding (no content-length); else None."""
    if not cycle.response_started or cycle.response_complete or cycle.disconnected:
        return None
    return ClientWriter(cycle) if cycle.chunked_encoding is True else None


class ClientWriter:
    """Chunked body pieces for one response, written to its transport. A client that reads slower
    than the stream (the server's flow control paused writing) gets its pieces held and written by
    a drain task once it catches up, in order."""

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._transport = cycle.transport
        self._flow = cycle.flow
        self._ready: list[bytes] = []  # pieces waiting for the rest of their stream's read
        self._held: list[bytes] = []
        self._drain: asyncio.Task | None = None

    @property
    def gone(self) -> bool:
        """The client closed the connection (the server saw it)."""
        return self._cycle.disconnected

    def write(self, body: bytes, more: bool = False) -> None:
        """Frame ``body`` as one chunk and write it, with any pieces ready before it in the same
        transport write; nothing for a gone client. ``more``: another piece of this stream is
        already in hand (it comes within this call stack), so this one waits for it."""
        if self._cycle.disconnected:
            return
        if not more and not self._ready:
            if body:
                self._put(b"%x\r\n%b\r\n" % (len(body), body))
            return
        if body:
            self._ready.append(b"%x\r\n%b\r\n" % (len(body), body))
        if not more and self._ready:
            pieces, self._ready = self._ready, []
            self._put(b"".join(pieces))

    def _put(self, piece: bytes) -> None:
        if self._held or self._flow.write_paused:
            self._held.append(piece)
            if self._drain is None:
                self._drain = asyncio.get_running_loop().create_task(self.flush())
            return
        self._transport.write(piece)

    async def flush(self) -> None:
        """Wait until every held piece is written (or the client is gone)."""
        while self._held and not self._cycle.disconnected:
            await self._flow.drain()
            pieces, self._held = self._held, []
            if not self._cycle.disconnected:
                self._transport.write(b"".join(pieces))
        self._held.clear()
        self._drain = None

    async def close(self) -> None:
        """Ready and held pieces first, so the server's last piece comes after them."""
        self.write(b"")  # a stream that ended on an error holds the pieces before it
        if self._drain is not None:
            await self._drain
        elif self._held:
            await self.flush()
