"""The router's cycle collector on a clock instead of on allocation counts.

CPython starts a young collection when allocations minus deallocations, of any generation, pass a
threshold. A router serving thousands of streams (or holding a backlog) makes request state as fast
as older requests free theirs, so the count barely moves while the young list keeps everything born
since the last collection that is still alive. When the count finally passes, that collection walks
every request born since: on the CPU box, 600 streams through one router, a young list of 148,943
objects against a count of 20,127 took 130 ms, a stall of every stream and every request in flight
(the H200 policy run saw 5 young collections of 54 ms on average, up to 78 ms, in 40 s).

Request state lives for seconds, so no generation boundary is cheap: what a collection walks is what
was born since the previous one and is still alive. On a clock (``TICK_S``), each collection walks only
that, and takes the young and middle generations together so that survivors reach the oldest
generation at once instead of being walked again by a middle collection (73 ms at 600 streams). The
oldest generation, every request alive but none of the frozen start-up heap
(``gc_pauses.freeze_heap``), is collected once per ``FULL_EVERY_S``: cycles that outlive a tick (a
cancelled stream's exception and its frames) wait at most that long.

Measured on the CPU box, 200 streams through one router, 20 s: the longest pause went from 78.9 ms
(2 collections, 85.8 ms in all) to 9.1 ms (354 collections, 295 ms in all, 1.5 % of the loop).
``FAIRLANE_GC_PACED=0`` in the environment leaves Python's own trigger in place (A/B runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from dataclasses import dataclass

TICK_S = 0.05
FULL_EVERY_S = 60.0


def pacing_wanted() -> bool:
    """Paced unless ``FAIRLANE_GC_PACED=0`` (Ray's processes inherit it from the shell that starts Ray)."""
    return os.environ.get("FAIRLANE_GC_PACED", "1") != "0"


@dataclass(slots=True)
class PacerCounts:
    ticks: int = 0
    full: int = 0


class GcPacer:
    """Turns Python's allocation-count trigger off and collects from the event loop on a clock.
    gc is process-wide: the other threads' objects are collected here too."""

    def __init__(self, tick_s: float = TICK_S, full_every_s: float = FULL_EVERY_S) -> None:
        self.tick_s = tick_s
        self.full_every_s = full_every_s
        self.counts = PacerCounts()
        self._last_full = time.monotonic()
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> GcPacer:
        """On the running loop; automatic collection stays off until ``stop``."""
        if not self.running:
            gc.disable()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gc-pacer")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        gc.enable()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick(time.monotonic())

    def tick(self, now: float) -> int:
        """One collection: the oldest generation when it is due at ``now``, else the two younger
        ones; returns the generation collected."""
        if now - self._last_full >= self.full_every_s:
            generation, self._last_full = 2, now
            self.counts.full += 1
        else:
            generation = 1
            self.counts.ticks += 1
        gc.collect(generation)
        return generation

    def reset(self) -> None:
        self.counts = PacerCounts()

    def snapshot(self) -> dict[str, object]:
        """Settings, and the collections since the last ``reset`` (their pauses: ``GcPauses``)."""
        return {
            "paced": self.running,
            "tick_s": self.tick_s,
            "full_every_s": self.full_every_s,
            "ticks": self.counts.ticks,
            "full": self.counts.full,
        }
