"""How fast a router's slots free up while requests wait for them: the rate its queue drains at.

Only the ends of slots that another request was waiting for count, and only the time between two
such ends with no slot ending on an empty queue between them: while the queue is empty the ends
follow the arrivals, not the replicas' speed. The estimate is the mean over the last ``window``
intervals, so it follows a replica that slows (a loaded box, a longer mix) within a few dozen ends.
"""

from __future__ import annotations

from collections import deque

WINDOW = 32  # intervals the rate is the mean of
MIN_INTERVALS = 8  # fewer: no estimate (a cold router admits as before)


class DrainRate:
    """Requests per second that leave a backlogged queue for a slot."""

    def __init__(self, window: int = WINDOW, min_intervals: int = MIN_INTERVALS) -> None:
        self._intervals: deque[float] = deque(maxlen=window)
        self._last: float | None = None  # the last end with work waiting, since the queue last idled
        self._min = min_intervals

    def slot_ended(self, now: float, queue_waiting: bool) -> None:
        """A slot ended at ``now``; ``queue_waiting``: a request was waiting for it."""
        if not queue_waiting:
            self._last = None
            return
        if self._last is not None:
            self._intervals.append(max(0.0, now - self._last))
        self._last = now

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
