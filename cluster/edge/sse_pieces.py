"""Pre-serialized SSE chunks for the plain streamed case: text deltas without logprobs, echo or
per-chunk usage, no tool-call shaping. Everything but the text is the same in every chunk of a choice,
so its JSON before and after the text is built once per choice and each chunk is three byte strings
joined. The bytes equal ``sse(chunk(...))``'s (``tests/cluster/edge/test_sse_pieces.py``)."""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from typing import Any


class PlainPieces:
    """One streamed response's text-delta chunks, by choice index. ``envelope``: the chunk's id,
    object, created and model, in that order; ``kind``: completion or chat."""

    def __init__(self, envelope: dict[str, Any], kind: str) -> None:
        self._head = json.dumps(envelope, separators=(",", ":"))[:-1]  # without its closing brace
        self._kind = kind
        self._around: dict[int, tuple[bytes, bytes]] = {}

    def piece(self, index: int, text: str) -> bytes:
        """The chunk of a started choice's text delta, its finish reason still null."""
        around = self._around.get(index)
        if around is None:
            around = self._around[index] = self._build(index)
        # json.dumps(text) for a str is this C function's result, without dumps' encoder set-up.
        return around[0] + encode_basestring_ascii(text).encode() + around[1]

    def _build(self, index: int) -> tuple[bytes, bytes]:
        if self._kind == "completion":
            before = f'{self._head},"choices":[{{"index":{index},"text":'
            after = ',"logprobs":null,"finish_reason":null}]}'
        else:
            before = f'{self._head},"choices":[{{"index":{index},"delta":{{"content":'
            after = '},"logprobs":null,"finish_reason":null}]}'
        return f"data: {before}".encode(), f"{after}\n\n".encode()
