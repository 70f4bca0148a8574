"""A non-streamed answer does not hold the router's loop for its whole burst of outputs (issue 22):
outputs already waiting are taken without suspending, so the collection yields every
``YIELD_EVERY`` outputs; its JSON (orjson) is the JSON ``json.dumps`` would write."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from fastapi.responses import JSONResponse

from cluster.edge.answers import YIELD_EVERY, FastJSON, answer
from cluster.edge.openai_schemas import CompletionRequest

OUTPUTS = 64


class BufferedRequest:
    """An open request whose outputs are all waiting: ``outputs`` never suspends. Each output notes
    how many times another task had run by then."""

    def __init__(self, ticks: list[int]) -> None:
        self.job = SimpleNamespace(prompt_ids=(1, 2, 3))
        self.lease = None
        self.ticks = ticks
        self.seen: list[int] = []

    async def outputs(self) -> AsyncIterator[dict[str, Any]]:
        for i in range(OUTPUTS):
            self.seen.append(len(self.ticks))
            last = i == OUTPUTS - 1
            yield {
                "index": 0,
                "text": "a",
                "token_ids": [7],
                "logprobs": [[7, -0.25, [[7, -0.25], [8, -1.5]]]],
                "finish_reason": "length" if last else None,
                "done": last,
                "num_prompt_tokens": 3,
                "total_output_tokens": i + 1,
            }


async def test_a_burst_of_waiting_outputs_is_several_steps() -> None:
    ticks: list[int] = []

    async def other_request() -> None:
        while True:
            ticks.append(1)
            await asyncio.sleep(0)

    other = asyncio.create_task(other_request())
    await asyncio.sleep(0)
    active = BufferedRequest(ticks)
    jobs = SimpleNamespace(encoder=SimpleNamespace(token_text=lambda i: f"t{i}"), tool_family=None)
    body = CompletionRequest(model="m", prompt="hi", max_tokens=OUTPUTS, logprobs=2)
    try:
        response = await answer("completion", "r1", body, active, jobs)  # type: ignore[arg-type]
    finally:
        other.cancel()
    # The other task ran between the outputs: once per YIELD_EVERY of them, not only at the end.
    runs_during = len(set(active.seen))
    assert runs_during >= OUTPUTS // YIELD_EVERY, active.seen
    # ... and no more often than that (a yield per output would cost a loop turn each).
    assert runs_during <= OUTPUTS // YIELD_EVERY + 1, active.seen
    answer_body = json.loads(response.body)
    choice = answer_body["choices"][0]
    assert choice["text"] == "a" * OUTPUTS and choice["finish_reason"] == "length"
    assert choice["logprobs"]["top_logprobs"][0] == {"t7": -0.25, "t8": -1.5}
    assert answer_body["usage"]["completion_tokens"] == OUTPUTS


def test_the_fast_answer_is_the_same_json() -> None:
    body = {
        "id": "cmpl-1",
        "choices": [{"text": 'é ü 漢字 "q" \\ \n', "logprobs": {"token_logprobs": [-1e-05, -3.25, 0.0]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2**40},
    }
    fast = FastJSON(body).body
    assert json.loads(fast) == json.loads(JSONResponse(body).body)
    assert FastJSON({"x": 1}).headers["content-type"] == "application/json"
    # json.dumps(allow_nan=False) refused a non-finite logprob (an error answer); orjson writes null.
    assert json.loads(FastJSON({"logprob": -math.inf}).body) == {"logprob": None}
