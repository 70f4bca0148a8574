"""Which tenant has the most requests waiting, in O(1): lanes bucketed by length.

When the whole queue is full, an arriving request of a shorter lane pushes out the newest request
of the longest one (``FairQueue.push``), so a tenant within its share is not refused because
others filled the room: the buffer is shared max-min fairly, as service is.
"""

from __future__ import annotations


class LaneLengths:
    def __init__(self) -> None:
        self._buckets: dict[int, set[str]] = {}
        self._longest = 0

    def changed(self, tenant_id: str, old: int, new: int) -> None:
        if old > 0:
            bucket = self._buckets[old]
            bucket.discard(tenant_id)
            if not bucket:
                del self._buckets[old]
        if new > 0:
            self._buckets.setdefault(new, set()).add(tenant_id)
            self._longest = max(self._longest, new)
        while self._longest > 0 and self._longest not in self._buckets:
            self._longest -= 1

    def longest(self) -> tuple[str, int] | None:
        """A tenant with the most waiting requests (ties: any of them), and that number."""
        if self._longest == 0:
            return None
        return min(self._buckets[self._longest]), self._longest
