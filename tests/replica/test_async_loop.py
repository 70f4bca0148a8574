"""The async loop's structure: step N+1 is launched before step N is read back, tokens carry over on
the device, and stop conditions land one step late without changing outputs."""

from __future__ import annotations

import asyncio

from replica import Engine, EngineConfig, SamplingParams
from tests.replica.conftest import collect


async def _traced_run(mode: str) -> tuple[list[tuple[str, int, bool]], list[list[int]]]:
    engine = Engine(EngineConfig(model="smollm2-135m", device="cpu", mode=mode))
    await engine.start()
    runner, core = engine.core.runner, engine.core
    trace: list[tuple[str, int, bool]] = []
    launch, wait, drain = runner.launch, runner.wait, core._drain_inbox

    def traced_drain(block, timeout=None):
        if timeout is not None:  # the loop's "nothing runnable" pause
            trace.append(("pause", -1, False))
        return drain(block, timeout)

    def traced_launch(plan, masks=None):
        handle = launch(plan, masks)
        trace.append(("launch", plan.step_id, any(i.prev_row >= 0 for i in plan.items)))
        return handle

    def traced_wait(handle):
        trace.append(("wait", handle.plan.step_id, False))
        return wait(handle)

    runner.launch, runner.wait, core._drain_inbox = traced_launch, traced_wait, traced_drain
    prompts = ["The sky is", "Rivers flow to", "My favourite food is"]
    try:
        results = await asyncio.gather(
            *(
                collect(engine, p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
                for p in prompts
            )
        )
    finally:
        await engine.stop()
    return trace, [r[0] for r in results]


async def test_async_launches_next_step_before_reading_previous():
    trace, outputs = await _traced_run("async")
    order = [(kind, step) for kind, step, _ in trace]
    launched_ahead = [
        step
        for kind, step in order
        if kind == "wait" and ("launch", step + 1) in order[: order.index((kind, step))]
    ]
    assert len(launched_ahead) >= 10, order[:20]
    assert any(placeholder for kind, _, placeholder in trace if kind == "launch"), (
        "no token carried on device"
    )
    sync_trace, sync_outputs = await _traced_run("sync")
    # With free KV blocks every step is runnable: neither mode may pause between steps.
    assert not [t for t in trace + sync_trace if t[0] == "pause"]
    sync_order = [(k, s) for k, s, _ in sync_trace]
    for i in range(0, len(sync_order), 2):
        assert sync_order[i][0] == "launch" and sync_order[i + 1] == ("wait", sync_order[i][1])
    assert not any(p for _, _, p in sync_trace)
    assert outputs == sync_outputs
    assert all(len(o) == 12 for o in outputs)


async def test_auto_mode_reads_each_step_back_at_once_on_the_cpu():
    """On the CPU a step computes inside its launch: "auto" (the default) reads it back before the
    next launch, so a token reaches its stream a step sooner than in async mode."""
    assert EngineConfig().mode == "auto"
    trace, outputs = await _traced_run("auto")
    order = [(k, s) for k, s, _ in trace]
    assert order[0::2] == [("launch", s) for _, s in order[0::2]]
    assert order[1::2] == [("wait", s) for _, s in order[0::2]]
    assert not any(p for _, _, p in trace)  # nothing carried: every token was on the host in time
    assert all(len(o) == 12 for o in outputs)


async def test_hold_admits_without_stepping_and_release_starts_one_batch():
    engine = Engine(
        EngineConfig(model="smollm2-135m", device="cpu", mode="async", max_num_batched_tokens=512)
    )
    await engine.start()
    first_steps: list[int] = []
    launch = engine.core.runner.launch

    def traced_launch(plan, masks=None):
        first_steps.append(len(plan.items))
        return launch(plan, masks)

    engine.core.runner.launch = traced_launch
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    try:
        engine.hold()
        prompts = ("One", "Two words", "Three more words")
        tasks = [asyncio.create_task(collect(engine, p, params)) for p in prompts]
        while engine.open_streams < 3:
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)  # held: the engine must not have started a step
        assert first_steps == []
        engine.release()
        results = await asyncio.gather(*tasks)
    finally:
        await engine.stop()
    assert first_steps[0] == 3  # all three prompts in the first step
    assert [len(r[0]) for r in results] == [3, 3, 3]
