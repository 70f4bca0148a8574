"""Requests a router sent to each replica that the replica's last report does not count yet.

Serve runs one ``choose_replicas`` per request; a burst runs many of them in one event-loop tick,
before any send updates Serve's queue-length cache or any report arrives, so every choice saw the
same numbers and the whole burst went to one replica. Each choice now adds its request's tokens to
the replica it picked, at once (an optimistic increment), and stops counting them once a report made
after the send is read (that report counts the request itself); they are dropped after ``FORGET_S``.

The other way round, a report made before a request ended may still count it as waiting: the
requests that ended since a replica's report take their tokens off what it reported waiting
(``reported_waiting``), so the holder of a conversation's prefix does not look busy with the turn
that just finished there.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

FORGET_S = 5.0  # a replica that stops reporting: its old sends stop weighing on it


@dataclass(slots=True)
class _Sent:
    tokens: float
    at: float  # wall clock, compared with the replica's reported_at (same host or NTP-close)


class SentSinceReport:
    """Kept per replica, so a choice reads only its candidates' recent sends (a few dozen each)."""

    def __init__(self, clock=time.time) -> None:
        self._clock = clock
        # replica id -> request id -> send, in the order sent: their times rise, so the front is
        # dropped in O(1) and the sends after a report are read from the back, never by a scan.
        self._by_replica: dict[str, OrderedDict[str, _Sent]] = {}
        # replica id -> sends Serve moved there (``routed``; rare): out of time order, kept apart.
        self._moved: dict[str, dict[str, _Sent]] = {}
        self._replica_of: dict[str, str] = {}  # request id -> the replica its latest choice named
        self._ended: dict[str, deque[tuple[float, float]]] = {}  # replica id -> (when, tokens) ended

    def chose(self, request_id: str, replica_id: str, tokens: float) -> None:
        """A choice for ``request_id`` (a later one for the same request replaces it)."""
        self._drop(request_id)
        self._by_replica.setdefault(replica_id, OrderedDict())[request_id] = _Sent(tokens, self._clock())
        self._replica_of[request_id] = replica_id

    def replica_of(self, request_id: str) -> str | None:
        """The replica the request's latest choice named (None: forgotten or never chosen)."""
        return self._replica_of.get(request_id)

    def sent_tokens(self, request_id: str) -> float | None:
        """The tokens the request's latest choice counted (None: forgotten or never chosen)."""
        replica_id = self._replica_of.get(request_id)
        sent = self._find(replica_id, request_id) if replica_id is not None else None
        return None if sent is None else sent.tokens

    def routed(self, request_id: str, replica_id: str) -> None:
        """Serve sent the request to ``replica_id`` (maybe not the first choice: it was full)."""
        previous = self._replica_of.get(request_id)
        if previous is None or previous == replica_id:
            return
        sent = self._pop(previous, request_id)
        if sent is not None:
            self._moved.setdefault(replica_id, {})[request_id] = sent
            self._replica_of[request_id] = replica_id

    def tokens(self, replica_id: str, reported_at: float | None) -> float:
        """Tokens sent to the replica after its report of ``reported_at`` (None: no report yet).
        Sends older than ``FORGET_S`` are dropped from the front; the sum reads back from the newest
        send to the first one the report covers. A router sending 500 requests/s kept ~1,250 sends
        per replica in the window, and summing them all for every candidate of every choice took
        17 % of its py-spy samples. A send the report counts stays until forgotten: Serve may still route
        its request elsewhere (``routed`` moves it, and the prefix it will hold)."""
        now = self._clock()
        since = reported_at if reported_at is not None else float("-inf")
        total = 0.0
        sends = self._by_replica.get(replica_id)
        if sends:
            while sends:
                request_id = next(iter(sends))
                if now - sends[request_id].at <= FORGET_S:
                    break
                del sends[request_id]
                self._replica_of.pop(request_id, None)
            for sent in reversed(sends.values()):
                if sent.at <= since:
                    break
                total += sent.tokens
        moved = self._moved.get(replica_id)
        if moved:
            for request_id in [r for r, sent in moved.items() if now - sent.at > FORGET_S]:
                del moved[request_id]
                self._replica_of.pop(request_id, None)
            total += sum(sent.tokens for sent in moved.values() if sent.at > since)
        return total

    def ended(self, replica_id: str, request_id: str, at: float | None = None) -> None:
        """``request_id`` ended on the replica (at wall time ``at``, default now): the tokens its send
        counted come off reports made before then. A send already forgotten counts nothing."""
        tokens = self.sent_tokens(request_id)
        if tokens is None:
            return
        ended = self._ended.setdefault(replica_id, deque())
        end = (self._clock() if at is None else at, tokens)
        if ended and end[0] < ended[-1][0]:  # reported late (another thread's batch): keep the order
            ended.insert(bisect.bisect_right(ended, end[0], key=lambda e: e[0]), end)
        else:
            ended.append(end)

    def reported_waiting(self, replica_id: str, waiting_tokens: float, reported_at: float | None) -> float:
        """The replica's reported waiting tokens less those of requests that ended after the report."""
        ended = self._ended.get(replica_id)
        if not ended or reported_at is None:
            return waiting_tokens
        horizon = self._clock() - FORGET_S
        while ended and ended[0][0] < horizon:
            ended.popleft()
        gone = 0.0
        for at, tokens in reversed(ended):  # in time order (``ended``): read back to the report
            if at <= reported_at:
                break
            gone += tokens
        return max(0.0, waiting_tokens - gone)

    def forget_replicas(self, live: set[str]) -> None:
        for sends in (self._by_replica, self._moved):
            for gone in set(sends) - live:
                for request_id in sends.pop(gone):
                    self._replica_of.pop(request_id, None)
        for gone in set(self._ended) - live:
            del self._ended[gone]

    def _drop(self, request_id: str) -> None:
        replica_id = self._replica_of.pop(request_id, None)
        if replica_id is not None:
            self._pop(replica_id, request_id)

    def _find(self, replica_id: str, request_id: str) -> _Sent | None:
        sent = self._by_replica.get(replica_id, {}).get(request_id)
        return sent if sent is not None else self._moved.get(replica_id, {}).get(request_id)

    def _pop(self, replica_id: str, request_id: str) -> _Sent | None:
        sent = self._by_replica.get(replica_id, {}).pop(request_id, None)
        return sent if sent is not None else self._moved.get(replica_id, {}).pop(request_id, None)
