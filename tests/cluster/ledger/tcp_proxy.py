"""A TCP forwarder in front of PostgreSQL that the outage drills stop and start: stopped, its port
refuses connections and every connection through it is cut, as when the database goes away (or
restarts). ``throttle`` caps the bytes a second each direction of a connection carries: a database
that answers, but slower than the rows come."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit, urlunsplit

from tests.redis_server import free_port


class TcpProxy:
    """127.0.0.1:``port`` -> ``target``; ``stop()`` refuses and cuts, ``start()`` serves again."""

    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.bytes_per_s: float | None = None

    def throttle(self, bytes_per_s: float | None) -> None:
        """Each read forwarded waits as long as its bytes take at this rate; None: full speed."""
        self.bytes_per_s = bytes_per_s

    @classmethod
    def for_dsn(cls, dsn: str) -> tuple[TcpProxy, str]:
        """A proxy in front of ``dsn``'s server, and the DSN that goes through it."""
        parts = urlsplit(dsn)
        proxy = cls(parts.hostname or "127.0.0.1", parts.port or 5432)
        auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return proxy, urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        self._call(self._stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)  # a stop while the upstream connects cuts this one too
        serving = self._server
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if self._server is None or self._server is not serving:
            # Stopped (or stopped and started) while connecting: the connection must not outlive
            # the outage, or a write "during" it would go through.
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                if self.bytes_per_s:
                    await asyncio.sleep(len(data) / self.bytes_per_s)
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.transport.abort()
        self._writers.discard(writer)
