"""The first frame of an internal connection: the peer's key, read small, in time, and compared in
constant time.

The router's stream receiver (``cluster/routing/stream_receiver.py``) and the replica's submit server
(``submit_server.py``) listen on ports any process that reaches the node can connect to; until its
key is checked, a peer is a stranger. So the hello is bounded three ways:

* its frame may carry what a key needs and no more (``HELLO_MAX_BYTES``): with the authenticated
  bound (256 MiB) a stranger could make the server buffer a quarter of a gigabyte per connection
  before anything was checked;
* it must arrive within ``HELLO_TIMEOUT_S``: a peer that sends nothing, or half a frame, would
  otherwise hold its connection, task and buffer for ever;
* the key is compared with ``hmac.compare_digest``, so the time a refusal takes says nothing about
  how many leading characters of a guess were right.
"""

from __future__ import annotations

import asyncio
import hmac

from cluster.serving.stream_frames import FrameError, read_frame

# A key is ``secrets.token_hex(16)``: 32 characters, 34 bytes as a JSON string. A few KiB leaves room
# for longer keys without letting a stranger's frame cost the server anything.
HELLO_MAX_BYTES = 4096
HELLO_TIMEOUT_S = 5.0  # a peer of ours writes its key at once, in the same write as its connect


async def read_hello(reader: asyncio.StreamReader, key: str, timeout_s: float = HELLO_TIMEOUT_S) -> None:
    """Return once the peer's first frame is ``key``. Raises ``FrameError`` for a wrong key, a frame
    over ``HELLO_MAX_BYTES`` or no whole frame within ``timeout_s`` (the caller drops the
    connection), ``asyncio.IncompleteReadError`` when the peer closed first."""
    try:
        async with asyncio.timeout(timeout_s):
            hello = await read_frame(reader, HELLO_MAX_BYTES)
    except TimeoutError as exc:
        raise FrameError(f"no hello within {timeout_s:g} s") from exc
    if not same_key(hello, key):
        raise FrameError("wrong key")


def same_key(given: object, key: str) -> bool:
    """Whether ``given`` is ``key``, in time that does not depend on where they differ. Compared as
    UTF-8 bytes: ``compare_digest`` raises on ``str`` with non-ASCII characters, which a stranger
    could send; anything but a string is refused."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode("utf-8"))
