"""Every request ends right when something fails inside the engine (issue 19: defects 6, 7 and 8)."""

from __future__ import annotations

import asyncio
import time

import pytest

from replica import Engine, EngineConfig, EngineStoppedError, RequestFailedError, SamplingParams
from tests.replica.conftest import collect, wait_until

GREEDY = dict(temperature=0.0, ignore_eos=True)


async def _fresh_engine() -> Engine:
    engine = Engine(
        EngineConfig(model="smollm2-135m", device="cpu", mode="async", max_num_batched_tokens=256)
    )
    await engine.start()
    return engine


async def test_a_failed_step_ends_exactly_its_own_requests(engine, tokenizer):
    """Step N's wait fails while step N+1 (which admitted C) is launched: A and B, in N, fail; C, only
    in N+1, is carried into N+2 from N+1's samples and must finish as if nothing happened."""
    runner = engine.core.runner
    launch, wait = runner.launch, runner.wait
    launched: list = []
    fired: list = []

    def recording_launch(plan, masks=None):
        handle = launch(plan, masks)
        launched.append(plan)
        return handle

    def failing_wait(handle):
        ids = {item.seq.request_id for item in handle.plan.items}
        newest = {item.seq.request_id for item in launched[-1].items} if launched else set()
        if not fired and "C" in newest and "C" not in ids:
            fired.append(handle.plan.step_id)
            raise RuntimeError("injected failure in a step's wait")
        return wait(handle)

    prompt_c = tokenizer.encode("The history of the bicycle begins", add_special_tokens=False)
    expected_c, _, _ = await collect(engine, prompt_c, SamplingParams(max_tokens=12, **GREEDY))
    runner.launch, runner.wait = recording_launch, failing_wait
    try:
        a = asyncio.create_task(
            collect(engine, "Tell me about bees.", SamplingParams(max_tokens=60, **GREEDY), "A")
        )
        b = asyncio.create_task(
            collect(engine, "Tell me about ants.", SamplingParams(max_tokens=60, **GREEDY), "B")
        )
        await wait_until(lambda: engine.stats().running == 2 and len(launched) > 3)
        c = asyncio.create_task(collect(engine, prompt_c, SamplingParams(max_tokens=12, **GREEDY), "C"))
        results = await asyncio.gather(a, b, c, return_exceptions=True)
    finally:
        runner.launch, runner.wait = launch, wait
    assert fired, "the injected failure never fired"
    assert isinstance(results[0], RequestFailedError) and isinstance(results[1], RequestFailedError)
    assert not isinstance(results[2], BaseException), results[2]
    assert results[2][0] == expected_c
    await wait_until(lambda: engine.stats().kv_blocks_used == 0)


async def test_a_crash_of_the_loop_ends_every_open_request_at_once():
    engine = await _fresh_engine()
    try:
        streams = [
            asyncio.create_task(
                collect(engine, f"Story number {i}:", SamplingParams(max_tokens=200, **GREEDY))
            )
            for i in range(3)
        ]
        await wait_until(lambda: engine.stats().running == 3)

        def broken_schedule():
            raise ValueError("injected bug in the scheduler")

        engine.core.scheduler.schedule = broken_schedule
        started = time.monotonic()
        results = await asyncio.gather(*streams, return_exceptions=True)
        assert time.monotonic() - started < 1.0
        assert all(isinstance(r, RequestFailedError) and "injected bug" in str(r) for r in results), results
        await wait_until(lambda: not engine.running)
        with pytest.raises(EngineStoppedError):
            await collect(engine, "anyone there?", SamplingParams(max_tokens=4))
    finally:
        await engine.stop()


async def test_an_id_reused_right_after_an_abort_gets_only_its_own_outputs(engine, tokenizer):
    first = tokenizer.encode("Once upon a time in a faraway land", add_special_tokens=False)
    second = tokenizer.encode("The recipe for bread is simple:", add_special_tokens=False)
    expected, _, _ = await collect(engine, second, SamplingParams(max_tokens=10, **GREEDY))
    for _ in range(5):  # the race is timing-dependent: several tries
        stream = engine.generate(first, SamplingParams(max_tokens=100, **GREEDY), request_id="same")
        await anext(stream)
        await stream.aclose()  # abort: the engine has not seen it yet when the new request starts
        tokens, _, last = await collect(engine, second, SamplingParams(max_tokens=10, **GREEDY), "same")
        assert last.finish_reason == "length" and tokens == expected
    await wait_until(lambda: engine.stats().kv_blocks_used == 0)
