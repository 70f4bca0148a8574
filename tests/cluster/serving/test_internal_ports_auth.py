"""The internal ports before authentication (issue 43): the router's stream receiver and the replica's
submit server accept any TCP peer, so until the key is checked a peer can make them hold nothing: a
first frame longer than a hello is refused from its length alone, a peer that sends nothing or half a
frame is dropped after the hello's timeout, a wrong key (or no string at all) is refused, and the key
is compared with ``hmac.compare_digest``. The right key still works on both."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from cluster.routing.stream_receiver import StreamReceiver
from cluster.serving.frame_hello import HELLO_MAX_BYTES
from cluster.serving.stream_frames import HEADER, MAX_FRAME_BYTES, encode, read_frame
from cluster.serving.submit_server import SubmitServer
from cluster.serving.wire import GenerateArgs
from tests.cluster.routing.test_stream_channel import FakeCall, _output

LONG_S = 60.0  # a hello timeout no test waits for: a drop under it is the bound's doing
SHORT_S = 0.2


@dataclass
class Port:
    """One internal port under test: its address and key, what it acted on, and a check that a
    connection with its key is served."""

    address: str
    key: str
    used: Callable[[], int]  # authenticated frames read, requests run
    works: Callable[[], Awaitable[None]]


@asynccontextmanager
async def _port(kind: str, hello_timeout_s: float) -> AsyncIterator[Port]:
    if kind == "receiver":
        receiver = StreamReceiver(hello_timeout_s=hello_timeout_s)
        await receiver.start()
        try:
            yield Port(receiver.address, receiver.key, lambda: receiver.frames, lambda: _streams(receiver))
        finally:
            await receiver.stop()
        return
    ran: list[str] = []

    async def run(args: GenerateArgs) -> dict:
        ran.append(args.request_id)
        return {"ok": True}

    server = SubmitServer(run, lambda: {"waiting_tokens": 3}, hello_timeout_s=hello_timeout_s)
    await server.start()
    try:
        yield Port(server.address, server.key, lambda: len(ran) + server.frames, lambda: _answers(server))
    finally:
        await server.stop()


async def _streams(receiver: StreamReceiver) -> None:
    """A replica's channel with the key reaches a stream."""
    stream = receiver.open("req-a", FakeCall(asyncio.sleep(10)))
    args = GenerateArgs("req-a", [1], {"max_tokens": 1}, reply_to=receiver.address, channel_key=receiver.key)
    _, writer = await _connect(receiver.address)
    writer.write(encode(receiver.key) + encode([_output(args, 0, 0, 1, 1, True, 1)]))
    item = await stream.next(5.0)
    assert item["token_ids"] == [0] and item["done"]
    stream.cancel()
    writer.close()


async def _answers(server: SubmitServer) -> None:
    """A router's link with the key is answered."""
    reader, writer = await _connect(server.address)
    writer.write(encode(server.key) + encode([["stats", "t1"]]))
    assert await read_frame(reader) == [["t1", {"waiting_tokens": 3}]]
    writer.close()


KINDS = ["receiver", "submit"]


async def _connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, number = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(number))


async def _dropped(reader: asyncio.StreamReader, within_s: float = 10.0) -> bool:
    """Whether the server closes the connection (having sent nothing) within ``within_s``."""
    try:
        return await asyncio.wait_for(reader.read(), within_s) == b""
    except TimeoutError:
        return False


def _generate() -> bytes:
    args = GenerateArgs("x", [1], {"max_tokens": 2}, reply_to="127.0.0.1:1", channel_key="k")
    return encode([["generate", args.as_wire()]])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [MAX_FRAME_BYTES, HELLO_MAX_BYTES + 1])
async def test_a_first_frame_longer_than_a_hello_is_dropped_before_its_body(kind: str, size: int) -> None:
    async with _port(kind, LONG_S) as port:
        reader, writer = await _connect(port.address)
        writer.write(HEADER.pack(size))  # and never the body: a drop now is from the length alone
        assert await _dropped(reader)
        assert port.used() == 0
        writer.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sent", [b"", HEADER.pack(34) + b'"0123'], ids=["nothing", "half-a-frame"])
async def test_a_peer_without_a_whole_hello_is_dropped_after_the_timeout(kind: str, sent: bytes) -> None:
    async with _port(kind, SHORT_S) as port:
        reader, writer = await _connect(port.address)
        writer.write(sent)
        assert await _dropped(reader)
        assert port.used() == 0
        writer.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hello", ["0" * 32, "é" * 32, ["key"], {"key": 1}, 7, None])
async def test_a_wrong_key_is_refused_and_the_port_serves_on(kind: str, hello: object) -> None:
    async with _port(kind, LONG_S) as port:
        reader, writer = await _connect(port.address)
        writer.write(encode(hello) + _generate())
        assert await _dropped(reader)
        assert port.used() == 0
        writer.close()
        await port.works()


@pytest.mark.parametrize("kind", KINDS)
async def test_the_key_is_compared_in_constant_time(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A timing measurement would be flaky; the comparison's being ``hmac.compare_digest`` is not."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    async with _port(kind, LONG_S) as port:
        reader, writer = await _connect(port.address)
        writer.write(encode("f" * 32))
        assert await _dropped(reader)
        writer.close()
        assert compared == [(b"f" * 32, port.key.encode())]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_right_key_still_works(kind: str) -> None:
    async with _port(kind, SHORT_S) as port:
        await port.works()


async def test_an_authenticated_channel_outlives_the_hello_timeout() -> None:
    receiver = StreamReceiver(hello_timeout_s=SHORT_S)
    await receiver.start()
    stream = receiver.open("req-b", FakeCall(asyncio.sleep(10)))
    args = GenerateArgs("req-b", [1], {"max_tokens": 2}, reply_to=receiver.address, channel_key=receiver.key)
    _, writer = await _connect(receiver.address)
    writer.write(encode(receiver.key) + encode([_output(args, 0, 0, 1, 1, False, 2)]))
    assert (await stream.next(5.0))["token_ids"] == [0]
    await _past_a_hello_timeout(receiver.address)
    writer.write(encode([_output(args, 0, 1, 1, 2, True, 2)]))
    last = await stream.next(5.0)
    assert last["token_ids"] == [1] and last["done"]
    stream.cancel()
    writer.close()
    await receiver.stop()


async def test_an_authenticated_link_outlives_the_hello_timeout() -> None:
    async with _port("submit", SHORT_S) as port:
        reader, writer = await _connect(port.address)
        writer.write(encode(port.key) + encode([["stats", "t1"]]))
        assert await read_frame(reader) == [["t1", {"waiting_tokens": 3}]]
        await _past_a_hello_timeout(port.address)
        writer.write(encode([["stats", "t2"]]))
        assert await read_frame(reader) == [["t2", {"waiting_tokens": 3}]]
        writer.close()


async def _past_a_hello_timeout(address: str) -> None:
    """Return once a stranger connected now has been dropped by its hello timeout: every connection
    opened before it is past its own."""
    reader, writer = await _connect(address)
    assert await _dropped(reader)
    writer.close()
