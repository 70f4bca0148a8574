"""The discrete-event core: a simulated clock and a heap of timed callbacks.

Nothing here reads the wall clock; ``now`` only moves when an event is taken off the heap, and
``clock`` (a bound method) is what the real tenancy code gets injected.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

Action = Callable[..., Any]


class EventLoop:
    """Events run in time order; ties run in scheduling order (a sequence number breaks them)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Action, tuple]] = []
        self._seq = itertools.count()
        self.events_run = 0

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action: Action, *args: Any) -> None:
        """Run ``action(*args)`` at simulated time ``when`` (never before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), action, args))

    def after(self, delay: float, action: Action, *args: Any) -> None:
        self.at(self.now + delay, action, *args)

    def run(self, until: float | None = None) -> None:
        """Run events in order until the heap is empty (or the next one is after ``until``)."""
        heap, pop = self._heap, heapq.heappop
        count = 0
        while heap:
            if until is not None and heap[0][0] > until:
                self.now = until
                break
            when, _, action, args = pop(heap)
            self.now = when
            action(*args)
            count += 1
        self.events_run += count

    def __len__(self) -> int:
        return len(self._heap)
