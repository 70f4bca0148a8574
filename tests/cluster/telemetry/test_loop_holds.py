"""LoopHolds: each task step of the watched loop timed alone, named by what it ran (no Ray)."""

from __future__ import annotations

import asyncio
import time

import uvloop

from cluster.telemetry.loop_holds import LoopHolds


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def _tokenize() -> None:
    _spin(0.004)  # this step holds the loop 4 ms
    await asyncio.sleep(0)


async def _busy_handler() -> None:
    await asyncio.sleep(0)
    await _tokenize()


async def _polite_handler() -> None:
    for _ in range(20):
        _spin(0.0002)  # 20 steps of 0.2 ms: 4 ms of work, no single hold over the bound
        await asyncio.sleep(0)


async def _measure() -> dict:
    holds = LoopHolds(bound_s=0.001)
    holds.start()
    try:
        await asyncio.gather(_polite_handler(), _polite_handler())
        polite = holds.snapshot()
        holds.reset()
        await asyncio.create_task(_busy_handler())
        return {"polite": polite, "busy": holds.snapshot()}
    finally:
        holds.stop()


def _check(got: dict) -> None:
    polite, busy = got["polite"], got["busy"]
    assert polite["steps"] >= 40 and polite["over_bound"] == 0, polite
    assert busy["over_bound"] == 1 and 4.0 <= busy["max_cpu_ms"] < 20.0, busy
    assert busy["longest"][0]["name"] == "_busy_handler > _tokenize", busy["longest"]
    assert busy["max_wall_ms"] >= busy["max_cpu_ms"] * 0.9


def test_a_long_step_is_caught_and_named_and_short_steps_are_not() -> None:
    _check(asyncio.run(_measure()))


def test_uvloop_as_ray_workers_run_it() -> None:
    _check(uvloop.run(_measure()))


def test_tasks_made_after_stop_are_not_timed() -> None:
    async def main() -> tuple[int, int]:
        holds = LoopHolds()
        holds.start()
        await asyncio.create_task(asyncio.sleep(0))
        seen = holds.steps
        holds.stop()
        await asyncio.create_task(_tokenize())
        return seen, holds.steps

    seen, after = asyncio.run(main())
    assert seen > 0 and after == seen
