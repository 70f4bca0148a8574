"""How fast a router's slots free up while it is busy: the rate a backlog would drain at.

The router is busy while every slot is taken or a request waits for one. Only the time between two
ends of one busy spell counts, or from the spell's start to its first end: once a slot stays free
with nothing waiting, ends follow the arrivals, not the replicas' speed, and the next spell starts
afresh. A closed loop that keeps the room full (a client with its own concurrency) counts. The
estimate is the mean over the last ``window`` intervals, so it follows a replica that slows (a
loaded box, a longer mix) within a few dozen ends.
"""

from __future__ import annotations

from collections import deque

WINDOW = 32  # intervals the rate is the mean of
MIN_INTERVALS = 8  # fewer: no estimate (a cold router admits as before)


class DrainRate:
    """Requests per second that a busy router's slots free up at."""

    def __init__(self, window: int = WINDOW, min_intervals: int = MIN_INTERVALS) -> None:
        self._intervals: deque[float] = deque(maxlen=window)
        self._last: float | None = None  # the last end (or the start) of the busy spell, if busy
        self._min = min_intervals

    def became_busy(self, now: float) -> None:
        """The router turned busy at ``now`` (a spell already under way keeps its start)."""
        if self._last is None:
            self._last = now

    def slot_ended(self, now: float) -> None:
        """A slot of the busy router ended at ``now``: one more interval of the spell."""
        if self._last is not None:
            self._intervals.append(max(0.0, now - self._last))
        self._last = now

    def became_idle(self) -> None:
        """A slot stays free and nothing waits: the spell is over; the next starts afresh."""
        self._last = None

    def per_s(self) -> float | None:
        """Requests per second, or None before ``min_intervals`` intervals were seen."""
        if len(self._intervals) < self._min:
            return None
        return len(self._intervals) / max(sum(self._intervals), 1e-9)

    def expected_wait_s(self, waiting: int, share: float) -> float | None:
        """Seconds until a request joining a lane of ``waiting`` requests gets its slot, when its
        tenant earns ``share`` of the dispatches: the next slot, then the ones its own lane's
        earlier requests take at the tenant's share. None: no estimate yet."""
        rate = self.per_s()
        if rate is None:
            return None
        return (1.0 + waiting / max(share, 1e-9)) / rate
