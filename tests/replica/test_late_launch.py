"""Late launch (replica/late_launch.py): the estimate errs short, and a request that arrives while a
step runs joins the very next step, one step sooner than when steps are planned as they begin."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from replica import Engine, EngineConfig, SamplingParams
from replica.late_launch import BLOCKED_S, HISTORY, LateLaunch, device_start, rows_bucket

# ---- the estimate ----------------------------------------------------------------------------------


def test_rows_bucket_rounds_up_to_a_power_of_two():
    assert [rows_bucket(n) for n in (0, 1, 2, 3, 4, 5, 64, 65, 128)] == [1, 1, 2, 4, 4, 8, 64, 128, 128]


def test_no_wait_until_a_pure_decode_step_of_the_shape_was_seen():
    late = LateLaunch(margin_ms=1.0)
    assert late.deadline(10.0, 100) is None
    late.observe(num_decode=100, num_prefill_tokens=300, compute_ms=40.0, host_ms=1.0, h2d_ms=0.1)
    assert late.deadline(10.0, 100) is None  # a step with prompt work teaches no decode time
    late.observe(num_decode=100, num_prefill_tokens=0, compute_ms=9.0, host_ms=1.5, h2d_ms=0.5)
    assert late.deadline(10.0, 100) == pytest.approx(10.0 + (9.0 - 1.5 - 0.5 - 1.0) / 1000)
    assert late.deadline(None, 100) is None  # the step's start on the device is unknown
    assert late.deadline(10.0, 20) is None  # another bucket of rows: nothing known


def test_estimate_is_the_shortest_recent_pure_decode_step_of_the_bucket():
    late = LateLaunch(margin_ms=0.0)
    for rows, ms in ((70, 8.0), (120, 9.5), (100, 8.6), (90, 8.4)):
        late.observe(num_decode=rows, num_prefill_tokens=0, compute_ms=ms, host_ms=0.0, h2d_ms=0.0)
    assert late.expected_compute_ms(128) == late.expected_compute_ms(65) == 8.0
    assert late.expected_compute_ms(64) is None  # another bucket
    for _ in range(HISTORY):  # older figures age out
        late.observe(num_decode=80, num_prefill_tokens=0, compute_ms=8.2, host_ms=0.0, h2d_ms=0.0)
    assert late.expected_compute_ms(100) == 8.2


def test_no_wait_when_host_work_fills_the_step():
    late = LateLaunch(margin_ms=1.0)
    late.observe(num_decode=4, num_prefill_tokens=0, compute_ms=3.0, host_ms=2.5, h2d_ms=0.0)
    assert late.deadline(5.0, 4) is None


def test_device_start_is_the_previous_steps_end_only_when_the_read_saw_it():
    assert device_start(1.0, 2.0, 2.0 + 2 * BLOCKED_S) == 2.0 + 2 * BLOCKED_S
    assert device_start(1.0, 2.0, 2.0 + BLOCKED_S / 10) == 1.0  # earlier than the truth, never later


# ---- the loop, on a pretend device -----------------------------------------------------------------

STEP_S = 0.2  # the pretend device's time per step: far above the CPU's real compute of a small batch


class PretendDevice:
    """Steps run one after another, STEP_S each, on a pretend device; the loop's read of a step
    blocks until it ends there. The host's real compute (inside launch on the CPU) is hidden, and the
    step reports the host and device times a GPU step would."""

    def __init__(self, engine: Engine) -> None:
        core = engine.core
        self.free_at = 0.0
        self.spans: dict[int, tuple[float, float]] = {}
        self.members: dict[int, set[str]] = {}
        launch, wait = core.runner.launch, core.runner.wait

        def launch_on_device(plan, masks=None):
            handle = launch(plan, masks)
            start = max(self.free_at, time.monotonic())
            self.free_at = start + STEP_S
            self.spans[plan.step_id] = (start, self.free_at)
            self.members[plan.step_id] = {item.seq.request_id for item in plan.items}
            times = {"prepare_ms": 0.1, "launch_ms": 0.1, "h2d_ms": 0.0, "d2h_ms": 0.0, "gap_ms": 0.0}
            handle.timings_ms = lambda: {**times, "compute_ms": STEP_S * 1000.0}
            return handle

        def wait_on_device(handle):
            time.sleep(max(0.0, self.spans[handle.plan.step_id][1] - time.monotonic()))
            return wait(handle)

        core.runner.launch, core.runner.wait = launch_on_device, wait_on_device

    def running_at(self, when: float) -> int:
        return next(step for step, (start, end) in self.spans.items() if start <= when < end)


PARAMS = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)


async def _run(engine: Engine, prompt: str, request_id: str) -> tuple[int, float]:
    """Tokens streamed, and when the engine took the request in (its host monotonic clock)."""
    count, arrival = 0, float("nan")
    async for out in engine.generate(prompt, PARAMS, request_id=request_id):
        count += len(out.token_ids)
        if out.metrics is not None:
            arrival = out.metrics.arrival
    return count, arrival


TRIES = 3  # a loaded box can stall the test's own clock past the half step: such a try says nothing


async def _one_try(late: bool) -> tuple[int, list[float], float]:
    """Steps after the one running at the newcomer's arrival until it is first scheduled; the loop's
    holds; how far into the running step it arrived, as a share of a step."""
    engine = Engine(EngineConfig(model="smollm2-135m", device="cpu", mode="async", late_launch=late))
    await engine.start()
    device = PretendDevice(engine)
    run = functools.partial(_run, engine)

    try:
        first = asyncio.create_task(run("The sky is", "steady"))
        while max(device.spans, default=-1) < 4:  # past the prompt and a few decode steps
            await asyncio.sleep(0.01)
        start, _ = device.spans[max(device.spans)]  # the newest step: running or next to run
        await asyncio.sleep(max(0.0, start + 0.3 * STEP_S - time.monotonic()))
        (steady, _), (newcomer, arrived) = await asyncio.gather(first, run("Rivers flow to", "newcomer"))
    finally:
        await engine.stop()
    assert [steady, newcomer] == [14, 14]  # nothing lost, nothing repeated
    joined = min(step for step, ids in device.members.items() if "newcomer" in ids)
    holds = [r.hold_ms for r in engine.core.profiler.records]
    running = device.running_at(arrived)
    into = (arrived - device.spans[running][0]) / STEP_S
    return joined - running, holds, into


async def _steps_to_join(late: bool) -> tuple[int, list[float]]:
    """How many steps after the one running at its arrival a new request is first scheduled in, for
    an arrival early in that step (in its first half, as the engine's own clock has it)."""
    tries = []
    for _ in range(TRIES):
        steps, holds, into = await _one_try(late)
        if into < 0.5:
            return steps, holds
        tries.append(into)
    raise AssertionError(f"no arrival landed in the first half of a step: {tries}")


async def test_an_arrival_joins_the_next_step_when_planned_late():
    steps, holds = await _steps_to_join(late=True)
    assert steps == 1
    assert max(holds) > STEP_S * 1000.0 / 2  # the loop waited for arrivals most of a step


async def test_an_arrival_waits_a_step_more_when_planned_early():
    steps, holds = await _steps_to_join(late=False)
    assert steps == 2
    assert max(holds) == 0.0


async def test_no_wait_while_top_tier_work_waits_in_the_engine():
    """One row: the second request waits (first tier) while the first runs, and the loop plans
    every step at once meanwhile; alone, it is held for arrivals again."""
    engine = Engine(
        EngineConfig(model="smollm2-135m", device="cpu", mode="async", late_launch=True, max_num_seqs=1)
    )
    await engine.start()
    device = PretendDevice(engine)
    try:
        both = (_run(engine, "The sky is", "first"), _run(engine, "Rivers flow", "second"))
        counts = await asyncio.gather(*both)
    finally:
        await engine.stop()
    assert [count for count, _ in counts] == [14, 14]
    holds = {r.step_id: r.hold_ms for r in engine.core.profiler.records}
    first = [holds[step] for step, ids in device.members.items() if ids == {"first"}]
    second = [holds[step] for step, ids in device.members.items() if ids == {"second"}]
    assert len(first) == len(second) == 14
    assert max(first) == 0.0
    assert max(second) > STEP_S * 1000.0 / 2
