"""The stream channel's frames: a 4-byte length, then an orjson array.

A replica writes one frame per flush on its channel to a router (``stream_channel.py``): every new
output of that router's open streams, each an output dict of ``wire.output_item`` (it names its
``request_id``). The first frame of a connection is the router's channel key alone, so only a
replica the router sent that key to (in ``GenerateArgs``) can write into its streams; that frame is
read with a small bound and a deadline (``frame_hello.py``), the rest with ``MAX_FRAME_BYTES``.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 256 << 20  # far above any flush; a larger length means a broken peer


class FrameError(ConnectionError):
    """A frame that cannot be one of ours: the connection is dropped."""


def encode(payload: Any) -> bytes:
    body = orjson.dumps(payload)
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> Any:
    """The next frame's payload; ``asyncio.IncompleteReadError`` at the end of the connection. A
    length over ``limit`` is refused from the header alone, before any of the body is read."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > limit:
        raise FrameError(f"frame of {size} bytes")
    try:
        return orjson.loads(await reader.readexactly(size))
    except orjson.JSONDecodeError as exc:
        raise FrameError("frame is not JSON") from exc
