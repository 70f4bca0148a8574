"""Lifts shared between routers, as per-tenant offsets merged by maximum.

A tenant returning from idle is lifted to its tier's smallest backlogged counter (``c = max(c,
L)``). With one queue per router, a lift kept local raises the tenant's counter on that router
only: the routers then rank it on different counters, ``c^k = G + Λ^k`` (``G``: its growth, which
they share; ``Λ^k``: the lifts router ``k`` applied), and as each router keeps lifting on its own
the ``Λ^k`` drift apart (docs/tenancy.md, "Several routers"). With ``share_lifts`` (off by default:
measured, it halved the gap on one trace and widened it on another) a lift is shared as the tenant's
**offset** ``o = c − G`` (the part of its counter that lifts made). Offsets only rise and are merged
by maximum, not added: the same lift learned twice, or two routers lifting a tenant for the same
return, raise it once (added, lifts feed the levels that make the next lifts, and diverge).

Lifts are recorded either way; without sharing (or with one router) the offsets are never read.
"""

from __future__ import annotations

from tenancy.fair_lanes import Lane


class SharedLifts:
    def __init__(self) -> None:
        self._lifted: dict[str, float] = {}  # tenant -> offset raised here since the last take

    def lift(self, lane: Lane, level: float) -> None:
        """Lift ``lane`` to ``level`` if it is below (and note the offset, to share it)."""
        if level > lane.counter:
            lane.offset += level - lane.counter
            lane.counter = level
            self._lifted[lane.tenant_id] = lane.offset

    def merge(self, lane: Lane, offset: float) -> bool:
        """Take another router's offset if it is higher; True when the counter rose."""
        if offset <= lane.offset:
            return False
        lane.counter += offset - lane.offset
        lane.offset = offset
        return True

    def take(self) -> dict[str, float]:
        taken, self._lifted = self._lifted, {}
        return taken
