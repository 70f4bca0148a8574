"""Logprobs that are not finite numbers reach clients as -9999.0 in both shapes, so every chunk and
body is strict JSON (JSON has no -Infinity or NaN; a JavaScript client's JSON.parse refuses them)."""

from __future__ import annotations

import json
import math

from cluster.edge.logprobs_format import FLOOR, CompletionLogprobs, chat_logprobs
from cluster.edge.responses import sse

ENTRIES = [[5, -math.inf, [[5, -math.inf], [7, math.nan], [9, -0.25]]], [7, -1.5, [[7, -1.5]]]]


def _text(token_id: int) -> str:
    return f"t{token_id}"


def test_chat_logprobs_send_the_floor_for_inf_and_nan() -> None:
    body = chat_logprobs(ENTRIES, _text, top=3)
    first, second = body["content"]
    assert first["logprob"] == FLOOR == -9999.0
    assert [t["logprob"] for t in first["top_logprobs"]] == [FLOOR, FLOOR, -0.25]
    assert second["logprob"] == -1.5  # finite values pass unchanged
    json.dumps(body, allow_nan=False)  # strict JSON


def test_completion_logprobs_send_the_floor_and_the_stream_chunk_is_strict_json() -> None:
    block = CompletionLogprobs(_text, top=3).block([None, *ENTRIES], [1, 5, 7])
    assert block["token_logprobs"] == [None, FLOOR, -1.5]
    assert block["top_logprobs"][1] == {"t5": FLOOR, "t7": FLOOR, "t9": -0.25}
    chunk = sse({"choices": [{"index": 0, "logprobs": block}]}).decode()
    assert "Infinity" not in chunk and "NaN" not in chunk
    json.loads(chunk.removeprefix("data: "), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
