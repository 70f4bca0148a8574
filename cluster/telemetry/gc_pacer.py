"""The router's cycle collector: Python's young trigger bounded by a clock, full collections when quiet.

CPython starts a young collection when allocations minus deallocations, of any generation, pass a
threshold. A router serving thousands of streams (or holding a backlog) makes request state as fast
as older requests free theirs, so the count barely moves while the young list keeps everything born
since the last collection that is still alive. When the count finally passes, that collection walks
every request born since: on the CPU box, 600 streams through one router (young threshold 20,000 for
that run), a young list of 148,943 objects against a count of 20,127 took 130 ms, a stall of every
stream and every request in flight (the H200 policy run saw 5 young collections of 54 ms on
average, up to 78 ms, in 40 s).

So every ``TICK_S`` the two younger generations are collected together: no young collection, the
clock's or Python's own (still on, at ``gc_pauses.YOUNG_OBJECTS``), walks more than what was born in
the last tick and is still alive, and survivors reach the oldest generation at once instead of being
walked again by a middle collection. Each tick walks the requests in flight too, so a tick that took
long spaces the next one out (``MAX_SHARE`` of the loop at most): at a 50-ms tick, collections took
10 % of a saturated router's loop on the H200.

The oldest generation holds every request alive (not the frozen start-up heap,
``gc_pauses.freeze_heap``); walking it under a backlog of thousands took 136 ms on the H200. Python
never starts it here: it runs once the router holds at most ``QUIET_HELD`` requests and
``FULL_AFTER_S`` have passed, or after ``FULL_EVERY_S`` whatever the router holds. Cycles that outlive
a tick (a cancelled stream's exception and its frames) wait that long.
Ray asks every worker for a full collection now and then (its raylet's local GC, every 90 minutes by
default, or when the object store fills); its ``PythonGCThread`` would run it at once, under load.
The pacer takes those requests over: a request makes a full collection due at the next quiet tick,
or ``FULL_AFTER_S`` after it whatever the router holds.
``FAIRLANE_GC_PACED=0`` in the environment leaves Python's own triggers alone (A/B runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

TICK_S = 0.25
MAX_SHARE = 0.02  # of the loop's time: a tick that took d waits at least d / MAX_SHARE for the next
FULL_AFTER_S = 60.0
FULL_EVERY_S = 600.0
QUIET_HELD = 16
NEVER = 2**31 - 1  # the oldest generation's threshold while paced: Python never starts a full collection
RAY_GC_THREAD = "PythonGCThread"  # ray._private.gc_collect_manager: runs its _gc_collect_func on request


def pacing_wanted() -> bool:
    """Paced unless ``FAIRLANE_GC_PACED=0`` (Ray's processes inherit it from the shell that starts Ray)."""
    return os.environ.get("FAIRLANE_GC_PACED", "1") != "0"


@dataclass(slots=True)
class PacerCounts:
    ticks: int = 0
    full: int = 0
    requested: int = 0  # full collections Ray asked for


class GcPacer:
    """Collects from the event loop on a clock; ``held`` says how many requests the process holds
    (full collections wait for a quiet moment). gc is process-wide: the other threads' objects are
    collected here too."""

    def __init__(
        self,
        held: Callable[[], int] = lambda: 0,
        tick_s: float = TICK_S,
        full_after_s: float = FULL_AFTER_S,
        full_every_s: float = FULL_EVERY_S,
    ) -> None:
        self.held = held
        self.tick_s = tick_s
        self.full_after_s = full_after_s
        self.full_every_s = full_every_s
        self.counts = PacerCounts()
        self._last_full = time.monotonic()
        self._thresholds: tuple[int, int, int] | None = None  # Python's, taken at start, given back at stop
        self._task: asyncio.Task | None = None
        self._requested_at: float | None = None  # when Ray asked for a full collection not yet run
        self._ray_threads: list[tuple[threading.Thread, Callable[[], int]]] = []  # and their own function

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> GcPacer:
        """On the running loop; Python starts no full collection until ``stop``."""
        if not self.running:
            if self._thresholds is None:  # not again after a task that ended: that would keep NEVER
                self._thresholds = gc.get_threshold()
            gc.set_threshold(self._thresholds[0], self._thresholds[1], NEVER)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gc-pacer")
            self._take_ray_requests()
        return self

    def _take_ray_requests(self) -> None:
        """Ray's GC thread calls ``request_full`` instead of a full collection (none in this process:
        nothing to take)."""
        for thread in threading.enumerate():
            own = getattr(thread, "_gc_collect_func", None)
            if thread.name == RAY_GC_THREAD and own is not None and own != self.request_full:
                thread._gc_collect_func = self.request_full
                self._ray_threads.append((thread, own))

    def request_full(self, now: float | None = None) -> int:
        """A full collection soon, at a quiet tick (called from Ray's thread); 0 objects freed now."""
        if self._requested_at is None:
            self._requested_at = time.monotonic() if now is None else now
        self.counts.requested += 1
        return 0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        for thread, own in self._ray_threads:
            thread._gc_collect_func = own
        self._ray_threads = []

    async def _run(self) -> None:
        wait = self.tick_s
        while True:
            await asyncio.sleep(wait)
            started = time.perf_counter()
            self.tick(time.monotonic())
            wait = self.next_wait(time.perf_counter() - started)

    def next_wait(self, took_s: float) -> float:
        """The clock never costs more than ``MAX_SHARE`` of the loop: a tick that walked a saturated
        router's requests in flight (24-47 ms each for 256 short requests on the H200, 8 % of its
        loop at one per 0.3 s) spaces the next one out, where Python's count would rarely start one."""
        return max(self.tick_s, took_s / MAX_SHARE)

    def tick(self, now: float) -> int:
        """One collection: the oldest generation when it is due at ``now``, else the two younger
        ones; returns the generation collected."""
        if self._full_due(now):
            generation, self._last_full, self._requested_at = 2, now, None
            self.counts.full += 1
        else:
            generation = 1
            self.counts.ticks += 1
        gc.collect(generation)
        return generation

    def _full_due(self, now: float) -> bool:
        since, asked = now - self._last_full, self._requested_at
        if since >= self.full_every_s or (asked is not None and now - asked >= self.full_after_s):
            return True
        return (since >= self.full_after_s or asked is not None) and self.held() <= QUIET_HELD

    def reset(self) -> None:
        self.counts = PacerCounts()

    def snapshot(self) -> dict[str, object]:
        """Settings, and the collections since the last ``reset`` (their pauses: ``GcPauses``)."""
        return {
            "paced": self.running,
            "tick_s": self.tick_s,
            "full_after_s": self.full_after_s,
            "full_every_s": self.full_every_s,
            "ticks": self.counts.ticks,
            "full": self.counts.full,
            "ray_requests": self.counts.requested,
            "ray_thread_taken": bool(self._ray_threads),
        }
