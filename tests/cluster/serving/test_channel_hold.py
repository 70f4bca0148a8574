"""The replica's stream channel holds outputs for the tick, and an urgent output (a request's first
or last) leaves in a frame of its own without taking the other streams' held outputs with it: at a
few hundred open streams, flushing everything on each one made a frame every engine step, one token
per stream and socket write at the router. Tested against a bare TCP server standing in for the
router, which records the frames it reads."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.serving.stream_channel import RouterChannel
from cluster.serving.stream_frames import read_frame

HOLD_S = 30.0  # far beyond any test step: what leaves before it left because it was urgent


class FrameSink:
    """A router's receiving end: every frame read after the key, in order."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)  # the key
        while True:
            try:
                await self.frames.put(await read_frame(reader))
            except asyncio.IncompleteReadError:
                return

    async def next(self) -> list[dict[str, Any]]:
        return await asyncio.wait_for(self.frames.get(), timeout=10)


def _item(request_id: str, token: int, done: bool = False) -> dict[str, Any]:
    return {"request_id": request_id, "index": 0, "token_ids": [token], "text": f" w{token}", "done": done}


async def test_an_urgent_output_leaves_alone_and_the_held_ones_wait_for_the_tick() -> None:
    sink = FrameSink()
    channel = RouterChannel(await sink.start(), "key", HOLD_S)
    channel.put(_item("a", 1), urgent=True)  # a's first token: at once
    assert [i["token_ids"] for i in await sink.next()] == [[1]]
    channel.put(_item("a", 2), urgent=False)
    channel.put(_item("a", 3), urgent=False)
    channel.put(_item("b", 10), urgent=True)  # b's first token: at once, and only b's
    frame = await sink.next()
    assert [(i["request_id"], i["token_ids"]) for i in frame] == [("b", [10])]
    channel.put(_item("b", 11, done=True), urgent=True)
    answer = await channel.answer("b", None, 2)  # b's end: written, a's outputs still held
    assert answer == {"ok": True}
    assert [(i["request_id"], i["token_ids"]) for i in await sink.next()] == [("b", [11])]
    assert sink.frames.empty()
    channel.flush_s = 0.0  # the tick is due: a's held outputs leave merged, as one item, with c's
    channel.put(_item("a", 4), urgent=False)
    channel.put(_item("c", 20), urgent=True)
    frame = [(i["request_id"], i["token_ids"]) for i in await sink.next()]
    assert frame == [("a", [2, 3, 4]), ("c", [20])]
    await channel.close()
    sink.server.close()


async def test_a_request_that_ends_on_an_error_has_its_held_outputs_written_first() -> None:
    sink = FrameSink()
    channel = RouterChannel(await sink.start(), "key", HOLD_S)
    channel.put(_item("a", 1), urgent=True)
    await sink.next()
    channel.put(_item("a", 2), urgent=False)  # held for the tick
    channel.put(_item("c", 5), urgent=False)
    error = {"error": {"type": "engine_error", "message": "boom"}}
    answer = await channel.answer("a", error, 2)  # the router reads 2 tokens, then the error
    assert answer["after_tokens"] == 2
    assert [(i["request_id"], i["token_ids"]) for i in await sink.next()] == [("a", [2])]
    assert sink.frames.empty()  # c's output is still held
    await channel.close()
    sink.server.close()
