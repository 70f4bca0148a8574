"""Requests that ended on each replica, as this router process saw them end, for the replica choice.

A replica's report is up to a stats period old, so it may still count a request that has ended as
waiting; the replica choice takes the tokens of requests that ended after the report off what it
reported (``SentSinceReport.reported_waiting``). The request flow records here the end of each
request Serve routed (direct dispatch counts its own ends on its links), on the router's loop;
``KVAwareRouter`` reads them (on Serve's router loop, maybe another thread). Serve's own
completion hook cannot serve: for a call with the rejection protocol it fires when the replica
accepts the request, not when it ends. Per replica, a bounded deque: appends and pops are
thread-safe, and what nobody reads (another model's replicas) is dropped.
"""

from __future__ import annotations

import time
from collections import deque

KEPT = 4096  # per replica: far more than end between two choices

_ENDS: dict[str, deque[tuple[str, float]]] = {}


def record(replica_id: str, request_id: str) -> None:
    """``request_id`` (the engine's id, as sent) ended on ``replica_id`` now."""
    ends = _ENDS.get(replica_id)
    if ends is None:
        ends = _ENDS.setdefault(replica_id, deque(maxlen=KEPT))
    ends.append((request_id, time.time()))


def take(replica_id: str) -> list[tuple[str, float]]:
    """The ends recorded for ``replica_id`` since the last take: (request id, wall time)."""
    ends = _ENDS.get(replica_id)
    out: list[tuple[str, float]] = []
    while ends:
        try:
            out.append(ends.popleft())
        except IndexError:
            break
    return out


def forget(replica_ids: set[str]) -> None:
    """Replicas that are gone take their ends with them."""
    for gone in set(_ENDS) - replica_ids:
        _ENDS.pop(gone, None)
