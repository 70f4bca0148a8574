"""The router reads its stream channels in large reads (``FrameBuffer``): a frame split across reads
joins, every frame a read completes comes out in order, a broken peer is refused from a frame's
header alone, and the frames before a broken one still reach their streams. An output whose stream
has a later output in the same read is marked ``more_coming`` while its sink runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cluster.routing.stream_receiver import FrameBuffer, StreamReceiver
from cluster.serving.stream_frames import HEADER, FrameError, encode
from tests.cluster.routing.test_stream_channel import FakeCall, until

PAYLOADS: list[Any] = [
    [{"request_id": "a", "text": "caf\u00e9"}],
    [],
    [{"request_id": "b", "n": 1}, {"request_id": "a", "n": 2}],
    [{"request_id": "c", "blob": "x" * 300}],  # a body longer than a byte's worth of length
]


def test_frames_split_at_every_byte_boundary_join() -> None:
    data = b"".join(encode(p) for p in PAYLOADS)
    for cut in range(len(data) + 1):
        frames = FrameBuffer()
        assert frames.feed(data[:cut]) + frames.feed(data[cut:]) == PAYLOADS, cut


def test_a_frame_a_byte_at_a_time_comes_out_once_whole() -> None:
    frames, got = FrameBuffer(), []
    data = encode(PAYLOADS[0])
    for i in range(len(data)):
        got.append(frames.feed(data[i : i + 1]))
    assert got == [[]] * (len(data) - 1) + [[PAYLOADS[0]]]


def test_several_frames_in_one_feed_come_out_in_order() -> None:
    frames = FrameBuffer()
    tail = encode(PAYLOADS[3])
    assert frames.feed(b"".join(encode(p) for p in PAYLOADS[:3]) + tail[:7]) == PAYLOADS[:3]
    assert frames.feed(tail[7:]) == [PAYLOADS[3]]
    assert frames.feed(b"") == []


def test_a_length_over_the_limit_is_refused_before_its_body_comes() -> None:
    frames = FrameBuffer(limit=64)
    assert frames.feed(encode(["ok"])) == [["ok"]]
    with pytest.raises(FrameError) as raised:
        frames.feed(HEADER.pack(65))  # the header alone: no body was sent
    assert isinstance(raised.value, ConnectionError)  # the receiver's drop of the connection
    assert FrameBuffer(limit=64).feed(HEADER.pack(64) + b" " * 63) == []  # at the limit: waits


def test_a_body_that_is_not_json_is_refused() -> None:
    body = b"{not json"
    with pytest.raises(FrameError):
        FrameBuffer().feed(HEADER.pack(len(body)) + body)


async def _channel(receiver: StreamReceiver, data: bytes) -> tuple[asyncio.StreamReader, Any]:
    """A connection to ``receiver`` that sends its key and ``data`` in one write (one read there)."""
    host, port = receiver.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(encode(receiver.key) + data)
    return reader, writer


def _recording(receiver: StreamReceiver, ids: list[str], seen: list[tuple[str, Any, bool]]) -> list:
    """Streams ``ids``, each output recorded with the receiver's ``more_coming`` as its sink saw it."""
    streams = []
    for request_id in ids:
        streams.append(receiver.open(request_id, FakeCall(asyncio.sleep(30))))
        receiver.redirect(
            request_id, lambda item, rid=request_id: seen.append((rid, item["n"], receiver.more_coming))
        )
    return streams


async def test_an_output_with_a_later_one_of_its_stream_in_the_same_read_is_marked() -> None:
    receiver = StreamReceiver()
    await receiver.start()
    seen: list[tuple[str, Any, bool]] = []
    streams = _recording(receiver, ["a", "b"], seen)
    first = [{"request_id": "a", "n": 1}, {"request_id": "b", "n": 1}, {"request_id": "gone", "n": 1}]
    second = [{"request_id": "a", "n": 2}, {"request_id": "b", "n": 2}, {"request_id": "a", "n": 3}]
    _, writer = await _channel(receiver, encode(first) + encode(second))
    await until(lambda: len(seen) == 5)
    assert receiver.frames == 2  # both frames came in the one read
    assert seen == [("a", 1, True), ("b", 1, True), ("a", 2, True), ("b", 2, False), ("a", 3, False)]
    assert receiver.more_coming is False  # only while a sink runs
    writer.close()
    for stream in streams:
        stream.cancel()
    await receiver.stop()


async def test_the_frames_before_a_broken_one_reach_their_streams() -> None:
    receiver = StreamReceiver()
    await receiver.start()
    seen: list[tuple[str, Any, bool]] = []
    streams = _recording(receiver, ["a"], seen)
    broken = HEADER.pack(5) + b"{oops"
    reader, writer = await _channel(receiver, encode([{"request_id": "a", "n": 1}]) + broken)
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the receiver dropped the connection
    assert seen == [("a", 1, False)]
    writer.close()
    for stream in streams:
        stream.cancel()
    await receiver.stop()
