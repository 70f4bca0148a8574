"""How long the router's event loop was held: a probe that asks to wake every few milliseconds and
records how late it woke. A late wake-up is time some callback kept the loop (or the GIL) from every
other request: tokenizing, templating or serializing on the loop shows up here."""

from __future__ import annotations

import asyncio
from collections import deque

PROBE_EVERY_S = 0.005
KEPT = 20_000  # the latest lags kept for the percentile (100 s at one probe per 5 ms)


class LoopLag:
    """Started once on the loop it watches; ``snapshot`` for ``/admin/state``, ``reset`` with the timings."""

    def __init__(self, every_s: float = PROBE_EVERY_S) -> None:
        self._every = every_s
        self._lags: deque[float] = deque(maxlen=KEPT)
        self.max_s = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(self._every)
            lag = max(0.0, loop.time() - asked - self._every)
            self._lags.append(lag)
            self.max_s = max(self.max_s, lag)

    def reset(self) -> None:
        self._lags.clear()
        self.max_s = 0.0

    def snapshot(self) -> dict[str, float | int]:
        """Milliseconds: the largest lag since the last reset and the p99 of the latest probes."""
        ordered = sorted(self._lags)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
        return {"max_ms": 1000 * self.max_s, "p99_ms": 1000 * p99, "probes": len(ordered)}
