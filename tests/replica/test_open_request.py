"""``Engine.submit``: a request's outputs go to a callback on the event loop, in order, and nothing after
the request ended; a callback that raises costs no other request its outputs; ``cancel`` aborts."""

from __future__ import annotations

import asyncio
import gc
import weakref

from replica import SamplingParams
from tests.replica.conftest import collect, wait_until

PROMPT = list(range(200, 230))


async def test_outputs_reach_the_callback_in_order_and_end_with_the_request(engine) -> None:
    seen: list = []
    ended = asyncio.get_running_loop().create_future()

    def on_output(out) -> None:
        seen.append(out)
        if not isinstance(out, Exception) and out.finished:
            ended.set_result(None)

    params = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)
    request = await engine.submit(PROMPT, params, on_output, request_id="cb-1")
    assert request.open and engine.open_streams == 1
    await asyncio.wait_for(ended, 60)
    assert not request.open and engine.open_streams == 0
    assert [out.finished for out in seen] == [False] * (len(seen) - 1) + [True]
    tokens = [t for out in seen for t in out.token_ids]
    assert [out.num_output_tokens for out in seen] == _running_totals(seen)  # nothing lost or twice
    assert tokens == (await collect(engine, PROMPT, params))[0]  # the generator path's tokens
    count = len(seen)
    request.cancel()  # after the end: nothing to abort
    await _one_more_request(engine)
    assert len(seen) == count


async def test_a_callback_that_raises_costs_other_requests_nothing(engine) -> None:
    def broken(out) -> None:
        raise RuntimeError("a caller's bug")

    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    await engine.submit(PROMPT, params, broken, request_id="cb-broken")
    tokens, _, last = await collect(engine, PROMPT[:20], params, request_id="cb-fine")
    assert len(tokens) == 6 and last.finished
    await wait_until(lambda: engine.open_streams == 0, 60)


async def test_cancel_aborts_a_request_still_producing(engine) -> None:
    seen: list = []
    params = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    request = await engine.submit(PROMPT, params, seen.append, request_id="cb-cancel")
    await wait_until(lambda: len(seen) >= 2, 60)
    assert engine.waiting_tokens == 0  # it produces: no longer queued work
    request.cancel()
    assert engine.open_streams == 0
    await wait_until(lambda: engine.stats().running == 0, 30)
    count = len(seen)
    await _one_more_request(engine)
    assert len(seen) == count and not any(getattr(out, "finished", False) for out in seen)


async def _one_more_request(engine) -> None:
    """A request run to its end after the one under test: the engine's loop delivers in order, so
    whatever the earlier request still had coming would have reached its callback by then."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    tokens, _, last = await collect(engine, PROMPT[:12], params)
    assert len(tokens) == 2 and last.finished


def _running_totals(outputs) -> list[int]:
    totals, total = [], 0
    for out in outputs:
        total += len(out.token_ids)
        totals.append(total)
    return totals


async def test_an_ended_request_is_freed_by_refcounting_alone(engine) -> None:
    """No reference cycle outlives a request: a busy replica raises the collector's thresholds, and
    every request's sequences (token lists, block tables) would wait for a full collection."""
    ended = asyncio.get_running_loop().create_future()

    def on_output(out) -> None:
        if out.finished:
            ended.set_result(None)

    gc.disable()
    try:
        request = await engine.submit(PROMPT, SamplingParams(max_tokens=3, ignore_eos=True), on_output)
        gone = [weakref.ref(request), *(weakref.ref(seq) for seq in request.seqs)]
        await asyncio.wait_for(ended, 60)
        await wait_until(lambda: engine.stats().running == 0, 30)
        del request
        # The engine thread drops its own references soon after; a cycle would keep them forever.
        await wait_until(lambda: all(ref() is None for ref in gone), 30)
    finally:
        gc.enable()
