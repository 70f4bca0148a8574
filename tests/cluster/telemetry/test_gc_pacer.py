"""The router's collector on a clock (cluster/telemetry/gc_pacer.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections import deque
from collections.abc import Iterator

import pytest

from cluster.telemetry.gc_pacer import MAX_SHARE, NEVER, GcPacer, pacing_wanted

BATCH = 1_000  # one "request's" state: tracked lists, born together, freed together


def _batch() -> list[list[int]]:
    return [[i] for i in range(BATCH)]


@pytest.fixture
def collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _collected_generations() -> tuple[list[int], object]:
    seen: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(on_gc)
    return seen, on_gc


@pytest.mark.usefixtures("collector_off")
def test_churn_leaves_the_count_still_while_the_young_list_grows() -> None:
    """Why the count trigger fails a router: state born as fast as older state dies keeps the
    allocation count near zero, so no young collection comes while the young list grows."""
    live = deque(_batch() for _ in range(20))
    gc.collect()  # the first requests are old now
    for _ in range(20):
        live.append(_batch())  # a request arrives ...
        live.popleft()  # ... as an older one ends
    assert gc.get_count()[0] < BATCH  # Python's trigger (700, or the router's 50,000) never fires
    assert len(gc.get_objects(0)) >= 20 * BATCH  # yet the next young collection would walk them all


@pytest.mark.usefixtures("collector_off")
def test_each_tick_walks_only_what_was_born_since_the_last_one() -> None:
    pacer = GcPacer(full_every_s=3600)
    live = deque(_batch() for _ in range(20))
    gc.collect()
    walked = []
    for _ in range(20):
        live.append(_batch())
        live.popleft()
        walked.append(len(gc.get_objects(0)) + len(gc.get_objects(1)))
        assert pacer.tick(now=0.0) == 1  # the two younger generations together
    assert max(walked) < 2 * BATCH  # one request's state (and the test's own few objects), not 20
    assert len(gc.get_objects(1)) == 0  # survivors went straight to the oldest generation
    assert pacer.snapshot()["ticks"] == 20 and pacer.snapshot()["full"] == 0


@pytest.mark.usefixtures("collector_off")
def test_the_oldest_generation_waits_for_a_quiet_moment_or_its_longest_interval() -> None:
    held = [0]
    pacer = GcPacer(held=lambda: held[0], full_after_s=10.0, full_every_s=100.0)
    start = pacer._last_full
    plan = [(1.0, 0), (9.9, 0), (10.0, 50), (10.5, 16), (20.0, 0), (25.0, 0), (60.0, 500), (125.1, 500)]
    seen, hook = _collected_generations()
    try:
        got = []
        for at, holding in plan:
            held[0] = holding
            got.append(pacer.tick(start + at))
    finally:
        gc.callbacks.remove(hook)
    # busy at 10 s: waits; quiet (16 held) at 10.5 s: full; 10 s later: full; busy past 100 s: full anyway
    assert got == [1, 1, 1, 2, 1, 2, 1, 2]
    assert seen == got  # each tick is one collection, of the generation it says
    assert pacer.snapshot()["full"] == 3 and pacer.snapshot()["ticks"] == 5
    pacer.reset()
    assert pacer.snapshot()["full"] == 0 and pacer.snapshot()["ticks"] == 0


def test_python_starts_no_full_collection_while_paced_and_its_triggers_come_back_after() -> None:
    async def run() -> tuple[tuple[int, int, int], int, bool]:
        pacer = GcPacer(tick_s=0.01).start()
        paced = gc.get_threshold()
        # Five ticks of the clock, however long a loaded box takes to give them.
        async with asyncio.timeout(30):
            while pacer.counts.ticks < 5:
                await asyncio.sleep(0.01)
        ticks = pacer.counts.ticks
        await pacer.stop()
        return paced, ticks, pacer.running

    before = gc.get_threshold()
    try:
        paced, ticks, running = asyncio.run(run())
        assert paced == (before[0], before[1], NEVER)  # young and middle triggers as they were
        assert ticks >= 5 and not running
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)


def test_pacing_is_on_unless_the_environment_says_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAIRLANE_GC_PACED", raising=False)
    assert pacing_wanted()
    monkeypatch.setenv("FAIRLANE_GC_PACED", "0")
    assert not pacing_wanted()
    monkeypatch.setenv("FAIRLANE_GC_PACED", "1")
    assert pacing_wanted()


def test_a_costly_tick_spaces_the_next_one_out() -> None:
    pacer = GcPacer(tick_s=0.25)
    assert pacer.next_wait(0.001) == 0.25  # cheap: on the clock
    assert pacer.next_wait(0.030) == pytest.approx(0.030 / MAX_SHARE)  # 30 ms: at most 2 % of the loop


def test_a_restart_after_the_clock_ended_still_gives_pythons_thresholds_back() -> None:
    async def run() -> None:
        pacer = GcPacer(tick_s=0.01).start()
        pacer._task.cancel()  # the clock ended without stop (an error in a tick, say)
        await asyncio.sleep(0)
        assert not pacer.running
        pacer.start()  # taken again now, the oldest threshold would be NEVER
        await pacer.stop()

    before = gc.get_threshold()
    try:
        asyncio.run(run())
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)


@pytest.mark.usefixtures("collector_off")
def test_a_full_collection_ray_asks_for_waits_for_a_quiet_tick_or_its_longest_delay() -> None:
    held = [500]
    pacer = GcPacer(held=lambda: held[0], full_after_s=10.0, full_every_s=100.0)
    start = pacer._last_full
    assert pacer.tick(start + 1.0) == 1
    pacer.request_full(now=start + 1.5)
    assert pacer.tick(start + 2.0) == 1  # busy: later
    held[0] = 3
    assert pacer.tick(start + 2.5) == 2  # quiet: now, before FULL_AFTER_S since the last full one
    assert pacer.tick(start + 3.0) == 1  # answered once
    held[0] = 500
    pacer.request_full(now=start + 3.0)
    assert [pacer.tick(start + at) for at in (5.0, 12.9, 13.0)] == [1, 1, 2]  # busy: 10 s after it asked
    assert pacer.snapshot()["ray_requests"] == 2 and pacer.snapshot()["full"] == 2


def test_rays_gc_thread_asks_the_pacer_while_it_runs_and_collects_itself_after() -> None:
    from ray._private.gc_collect_manager import PythonGCThread

    ran: list[str] = []
    ray_thread = PythonGCThread(gc_collect_func=lambda: ran.append("ray's own") or 0)
    ray_thread.start()

    async def run() -> tuple[int, bool]:
        pacer = GcPacer(tick_s=10.0).start()
        ray_thread.trigger_gc()  # what Ray's core worker does when its raylet asks for a collection
        for _ in range(100):
            if pacer.counts.requested:
                break
            await asyncio.sleep(0.01)
        taken = pacer.snapshot()["ray_thread_taken"]
        await pacer.stop()
        return pacer.counts.requested, taken

    before = gc.get_threshold()
    try:
        requested, taken = asyncio.run(run())
        assert (requested, taken, ran) == (1, True, [])  # deferred to the pacer, not collected at once
        ray_thread.trigger_gc()  # the pacer stopped: Ray's own function again
        for _ in range(100):
            if ran:
                break
            threading.Event().wait(0.01)
        assert ran == ["ray's own"]
    finally:
        ray_thread.stop()
        gc.set_threshold(*before)
