"""The pre-serialized text-delta chunks are byte for byte what the general chunk builder writes, for
completions and chat, several choices, and text that JSON must escape (as ``json.dumps`` does)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from cluster.edge.responses import ResponseMeta, sse_stream
from cluster.edge.sse_pieces import PlainPieces

TEXTS = [" Hello", ' "quoted"', " line\nbreak", " caf\u00e9 \u2603", " back\\slash", "", " tab\t"]
# Control characters, JavaScript's line separators, a character beyond the BMP, a lone surrogate.
TEXTS += [" nul\x00 bell\x07 esc\x1b del\x7f", " \u2028sep\u2029", " \U0001f600 \ud800", " end"]


def _items(n: int) -> list[dict]:
    items, totals = [], 0
    for step, text in enumerate(TEXTS):
        for index in range(n):
            last = step == len(TEXTS) - 1
            totals += 1
            items.append(
                {
                    "request_id": "r", "index": index, "token_ids": [step], "text": text,
                    "finish_reason": "length" if last else None, "num_prompt_tokens": 3,
                    "num_output_tokens": step + 1, "total_output_tokens": totals,
                    "done": last and index == n - 1,
                }
            )  # fmt: skip
    return items


async def _stream(kind: str, n: int, plain: bool) -> bytes:
    async def outputs() -> AsyncIterator[dict]:
        for item in _items(n):
            yield item

    meta = ResponseMeta(kind, "id-1", "m", 123)  # type: ignore[arg-type]
    shape = None if plain else (lambda body: [body])  # a shaper takes the general path
    return b"".join([p async for p in sse_stream(meta, outputs(), True, n=n, shape=shape)])


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("n", [1, 3])
async def test_plain_pieces_equal_the_general_chunks(kind: str, n: int, monkeypatch) -> None:
    used: list[int] = []
    piece = PlainPieces.piece
    monkeypatch.setattr(PlainPieces, "piece", lambda self, i, text: used.append(i) or piece(self, i, text))
    general = await _stream(kind, n, False)
    assert not used
    fast = await _stream(kind, n, True)
    assert fast == general
    assert len(used) == (len(TEXTS) - 3) * n  # all but each choice's first, empty and last deltas


@pytest.mark.parametrize("text", TEXTS)
def test_a_piece_holds_its_text_as_json_dumps_writes_it(text: str) -> None:
    pieces = PlainPieces({"id": "i", "object": "text_completion", "created": 1, "model": "m"}, "completion")
    piece = pieces.piece(0, text)
    assert piece.startswith(b'data: {"id":"i"') and piece.endswith(b"\n\n")
    quoted = json.dumps(text).encode()
    assert piece.split(b'"text":', 1)[1].startswith(quoted + b',"logprobs":null')
