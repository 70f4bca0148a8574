"""Replica-choice policies: round robin, least loaded, and fairlane's (``cluster.routing.kv_router``).

fairlane's ranking is the real ``cluster.routing.replica_ranking.replica_score`` (pure, no Ray; the
router's ``load`` choice). It is fed what Serve
feeds it: routing stats refreshed every ``stats_period_s`` (free KV blocks, waiting tokens) and
the router's own count of requests on the replica. Serve then takes the first rank with room
(``max_ongoing_requests``); so do these.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

from loadtest.sim.replica import SimReplica


class Chooser(Protocol):
    def choose(self, replicas: Sequence[SimReplica], max_ongoing: int) -> SimReplica | None: ...

    def refresh(self, replicas: Sequence[SimReplica]) -> None:
        """Routing stats were polled (every ``routing_stats_period_s``)."""

    def changed(self, replica: SimReplica) -> None:
        """A request was sent to or ended on ``replica``."""


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[SimReplica], max_ongoing: int) -> SimReplica | None:
        n = len(replicas)
        for i in range(n):
            r = replicas[(self._next + i) % n]
            if r.ongoing < max_ongoing:
                self._next = (self._next + i + 1) % n
                return r
        return None

    def refresh(self, replicas: Sequence[SimReplica]) -> None:
        return None

    def changed(self, replica: SimReplica) -> None:
        return None


class LeastLoaded:
    """Fewest requests on the replica (running + waiting), ties to the lowest index."""

    def choose(self, replicas: Sequence[SimReplica], max_ongoing: int) -> SimReplica | None:
        best = min(replicas, key=lambda r: r.ongoing, default=None)
        return best if best is not None and best.ongoing < max_ongoing else None

    def refresh(self, replicas: Sequence[SimReplica]) -> None:
        return None

    def changed(self, replica: SimReplica) -> None:
        return None


class FairlaneKV:
    """``KVAwareRouter``'s ranking: ``replica_score(routing_stats, queue_len)``, lowest first.

    Scores only change when the stats are polled or a request is sent to / ends on a replica, so
    they are kept in a heap with lazy invalidation instead of re-sorting 64 replicas per request
    (same order as sorting by the score, ties to the lower index).
    """

    def __init__(self, block_tokens: int = 16) -> None:
        from cluster.routing.replica_ranking import replica_score

        self._score = replica_score
        self._block_tokens = block_tokens
        self._stats: dict[int, dict] = {}
        self._version: dict[int, int] = {}
        self._heap: list[tuple[tuple[float, float], int, int, SimReplica]] = []

    def refresh(self, replicas: Sequence[SimReplica]) -> None:
        """What ``record_routing_stats`` would publish now (Serve polls it periodically)."""
        self._stats = {
            r.index: {"kv_blocks_free": r.free_blocks, "waiting_tokens": r.waiting_tokens} for r in replicas
        }
        self._version = {r.index: self._version.get(r.index, 0) + 1 for r in replicas}
        self._heap = [self._entry(r) for r in replicas]
        heapq.heapify(self._heap)

    def changed(self, replica: SimReplica) -> None:
        if replica.index in self._version:
            self._version[replica.index] += 1
            heapq.heappush(self._heap, self._entry(replica))

    def choose(self, replicas: Sequence[SimReplica], max_ongoing: int) -> SimReplica | None:
        heap, version = self._heap, self._version
        while heap and version.get(heap[0][1]) != heap[0][2]:
            heapq.heappop(heap)
        if heap and heap[0][3].ongoing < max_ongoing:
            return heap[0][3]
        ranked = sorted(replicas, key=lambda r: self._entry(r)[:2])
        return next((r for r in ranked if r.ongoing < max_ongoing), None)

    def _entry(self, r: SimReplica) -> tuple[tuple[float, float], int, int, SimReplica]:
        score = self._score(self._stats.get(r.index, {}), r.ongoing, self._block_tokens)
        return (score, r.index, self._version.get(r.index, 0), r)


CHOOSERS = {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "fairlane": FairlaneKV}


def make_chooser(name: str) -> Chooser:
    try:
        return CHOOSERS[name]()
    except KeyError:
        raise ValueError(f"unknown replica choice {name!r}; known: {', '.join(CHOOSERS)}") from None
