"""A stream's body pieces that are ready together (``more``: another of its outputs came in the same
read of the stream channel) leave in one transport write, each still its own chunk, in order; a
piece with nothing after it goes at once; closing writes what was held, and a gone client gets
nothing."""

from __future__ import annotations

import asyncio

from cluster.edge.client_writer import ClientWriter


def chunk(body: bytes) -> bytes:
    """``body`` as one chunk of HTTP chunked encoding, as uvicorn frames it."""
    return b"%x\r\n%b\r\n" % (len(body), body)


class _Flow:
    """uvicorn's flow control as the writer sees it: paused until ``resume`` when made paused."""

    def __init__(self, paused: bool) -> None:
        self.write_paused = paused
        self._writable = asyncio.Event()
        if not paused:
            self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()

    def resume(self) -> None:
        self.write_paused = False
        self._writable.set()


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


class _Cycle:
    def __init__(self, paused: bool = False) -> None:
        self.transport, self.flow, self.disconnected = _Transport(), _Flow(paused), False


async def test_pieces_ready_together_leave_in_one_write_in_order() -> None:
    cycle = _Cycle()
    writer = ClientWriter(cycle)
    writer.write(b"one", more=True)
    writer.write(b"two", more=True)
    assert cycle.transport.written == []  # waiting for the last of the read
    writer.write(b"three")
    assert cycle.transport.written == [chunk(b"one") + chunk(b"two") + chunk(b"three")]
    writer.write(b"four")  # alone: at once, a write of its own
    assert cycle.transport.written[1:] == [chunk(b"four")]
    await writer.close()
    assert len(cycle.transport.written) == 2


async def test_an_empty_last_piece_sends_the_ready_ones_and_alone_sends_nothing() -> None:
    cycle = _Cycle()
    writer = ClientWriter(cycle)
    writer.write(b"")
    assert cycle.transport.written == []  # an empty chunk would end the body
    writer.write(b"a", more=True)
    writer.write(b"", more=True)  # a token that renders to nothing yet
    writer.write(b"")
    assert cycle.transport.written == [chunk(b"a")]


async def test_close_writes_the_ready_pieces_of_a_stream_that_ended_before_its_last() -> None:
    cycle = _Cycle()
    writer = ClientWriter(cycle)
    writer.write(b"one", more=True)
    writer.write(b"two", more=True)  # the next output raised (an error), so none came with more=False
    await writer.close()
    assert cycle.transport.written == [chunk(b"one") + chunk(b"two")]


async def test_a_slow_client_gets_ready_and_held_pieces_in_one_write_in_order() -> None:
    cycle = _Cycle(paused=True)
    writer = ClientWriter(cycle)
    writer.write(b"one", more=True)
    writer.write(b"two")
    writer.write(b"three", more=True)
    assert cycle.transport.written == []  # paused: held
    cycle.flow.resume()
    writer.write(b"four")  # after the held ones, though writing is no longer paused
    await writer.close()
    assert cycle.transport.written == [b"".join(chunk(p) for p in (b"one", b"two", b"three", b"four"))]


async def test_a_gone_client_gets_nothing_ready_or_not() -> None:
    cycle = _Cycle()
    writer = ClientWriter(cycle)
    cycle.disconnected = True
    writer.write(b"one", more=True)
    writer.write(b"two")
    await writer.close()
    assert cycle.transport.written == []
