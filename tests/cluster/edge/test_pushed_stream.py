"""A streamed answer pushed straight to the client's socket: a real uvicorn server (the httptools
protocol Serve's direct ingress runs) serves ``SseResponse`` behind a wrapping layer, as Serve's and
Starlette's are; the stream channel and receiver are real (``test_stream_channel``'s stand-in
replicas). Every token of many concurrent streams arrives in order, exactly once, with the bytes of
the pulled path; a client that leaves mid-stream gets its request aborted on the replica."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from cluster.edge import stream_responses
from cluster.edge.client_writer import ClientWriter
from cluster.edge.responses import ResponseMeta, SseRenderer
from cluster.edge.stream_responses import SseResponse
from cluster.routing.stream_receiver import StreamReceiver
from tests.cluster.routing.test_stream_channel import ChannelReplicas, PacedOutputs, _job, _runner


class Served:
    """The answer app on a real uvicorn server on a free port, in this event loop."""

    def __init__(self, runner) -> None:
        self.runner = runner

    async def app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        _, number, tokens = scope["path"].rsplit("/", 2)
        active = await self.runner.open(_job(self.runner, int(number), int(tokens)))
        meta = ResponseMeta("completion", f"cmpl-{number}", "m", 1)
        response = SseResponse(active, SseRenderer(meta, include_usage=True), {"x-request-id": number})

        async def wrapping_send(message) -> None:  # a middleware's layer around the server's send
            await send(message)

        await response(scope, receive, wrapping_send)

    async def __aenter__(self) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            self.app, http="httptools", interface="asgi3", lifespan="off", log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:
            await asyncio.sleep(0.01)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def __aexit__(self, *_) -> None:
        self.server.should_exit = True
        await self.task


async def _events(client: httpx.AsyncClient, url: str, leave_after: int | None = None) -> list[str]:
    """The SSE payloads of one streamed answer (``leave_after`` events, then the client goes)."""
    got: list[str] = []
    async with client.stream("POST", url) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                got.append(line[6:])
                if leave_after is not None and len(got) == leave_after:
                    break
    return got


def _text(events: list[str]) -> str:
    return "".join(
        json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]" and json.loads(e)["choices"]
    )


@pytest.fixture
async def channel() -> AsyncIterator[tuple[StreamReceiver, ChannelReplicas]]:
    receiver = StreamReceiver()
    await receiver.start()
    replicas = ChannelReplicas(PacedOutputs(random.Random(17)))
    yield receiver, replicas
    await replicas.channels.close()
    await receiver.stop()


async def test_pushed_streams_deliver_every_token_in_order_exactly_once(channel) -> None:
    receiver, replicas = channel
    runner = _runner(replicas, receiver)
    before = stream_responses.STREAM_PATHS["pushed"]
    lengths = [random.Random(i).randint(1, 80) for i in range(40)]
    async with Served(runner) as base, httpx.AsyncClient(timeout=30) as client:
        results = await asyncio.gather(
            *(_events(client, f"{base}/v1/{i}/{n}") for i, n in enumerate(lengths))
        )
    assert stream_responses.STREAM_PATHS["pushed"] - before == len(lengths)  # the socket path, every one
    for n, events in zip(lengths, results, strict=True):
        assert _text(events) == "".join(f" w{t}" for t in range(n))  # in order, none lost, none twice
        assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == n
    assert all(r.outcome == "ok" for r in runner.recorder.records())
    assert receiver.open_streams == 0 and runner.dispatcher.in_flight == 0


async def test_a_client_that_leaves_a_pushed_stream_aborts_its_request(channel) -> None:
    receiver, replicas = channel
    runner = _runner(replicas, receiver)
    async with Served(runner) as base, httpx.AsyncClient(timeout=30) as client:
        staying = [asyncio.create_task(_events(client, f"{base}/v1/{i}/60")) for i in range(1, 9)]
        got = await _events(client, f"{base}/v1/0/1000", leave_after=3)
        results = await asyncio.gather(*staying)
        for _ in range(300):  # the server sees the connection close; the next output notices it
            if "req-0" in replicas.paced.aborted:
                break
            await asyncio.sleep(0.01)
    assert replicas.paced.aborted == {"req-0"} and len(got) == 3
    assert all(_text(events) == "".join(f" w{t}" for t in range(60)) for events in results)
    records = {r.request_id: r for r in runner.recorder.records()}
    assert (records["req-0"].outcome, records["req-0"].reason) == ("aborted", "client_gone")
    assert sum(r.outcome == "ok" for r in records.values()) == 8
    assert receiver.open_streams == 0 and runner.dispatcher.in_flight == 0


class _Flow:
    """uvicorn's flow control as the writer sees it: paused until ``resume``."""

    def __init__(self) -> None:
        self.write_paused = True
        self._writable = asyncio.Event()

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
    def __init__(self) -> None:
        self.transport, self.flow, self.disconnected = _Transport(), _Flow(), False


async def test_a_slow_client_gets_its_held_pieces_in_order_once_it_reads() -> None:
    cycle = _Cycle()
    writer = ClientWriter(cycle)
    for piece in (b"one", b"two", b"three"):
        writer.write(piece)
    await asyncio.sleep(0.01)
    assert cycle.transport.written == []  # paused: held, not written
    cycle.flow.resume()
    writer.write(b"four")  # after the others, though writing is no longer paused
    await writer.close()
    assert b"".join(cycle.transport.written) == b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n4\r\nfour\r\n"
