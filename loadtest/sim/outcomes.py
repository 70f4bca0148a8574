"""Per-request outcomes and per-tenant backlog samples, in flat arrays (1M requests fit easily)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

OK, QUOTA, LIMIT, QUEUE_FULL, QUEUE_TIMEOUT, UNFINISHED = range(6)
STATUS_NAMES = ("ok", "quota_exceeded", "request_limit", "queue_full", "queue_timeout", "unfinished")
HTTP_STATUS = (200, 429, 400, 429, 503, 0)


class Outcomes:
    """What happened to request ``i`` of the trace; times are simulated seconds."""

    def __init__(self, n: int) -> None:
        self.status = np.full(n, UNFINISHED, dtype=np.int8)
        self.reason: dict[int, str] = {}
        self.dispatched = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.output = np.zeros(n, dtype=np.int32)
        self.replica = np.full(n, -1, dtype=np.int16)

    def fail(self, i: int, status: int, now: float, reason: str = "") -> None:
        self.status[i] = status
        self.end[i] = now
        if reason:
            self.reason[i] = reason

    def done(self, i: int, first_token: float, now: float, output: int, replica: int) -> None:
        self.status[i] = OK
        self.first_token[i] = first_token
        self.end[i] = now
        self.output[i] = output
        self.replica[i] = replica


@dataclass(slots=True)
class BacklogSampler:
    """Which tenants were backlogged, sampled (service is not sampled here: ``service_curve.py``
    computes the service each tenant *received* from the outcomes, as the fairness bound counts it).

    ``backlogged[j][k]``: tenant ``k`` had a request waiting at every instant from sample ``j − 1``
    to sample ``j`` (its queue never emptied in between). A tenant that empties between two samples
    is lifted when it returns (no banked credit), so a sample-instant test would count it as
    backlogged while the queue rightly treats it as new.
    """

    tenants: int
    waiting: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    backlogged: list[np.ndarray] = field(default_factory=list)
    _emptied: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.waiting = [0] * self.tenants

    def enqueued(self, k: int) -> None:
        if self.waiting[k] == 0:
            self._emptied.add(k)  # it was empty since the last sample
        self.waiting[k] += 1

    def dequeued(self, k: int) -> None:
        self.waiting[k] -= 1

    def sample(self, now: float) -> None:
        self.times.append(now)
        held = np.array(self.waiting) > 0
        if self._emptied:
            held[list(self._emptied)] = False
        self.backlogged.append(held)
        self._emptied = set()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Sample times and ``[sample, tenant]`` backlogged through the interval ending there."""
        if not self.times:
            return np.zeros(0), np.zeros((0, self.tenants), dtype=bool)
        return np.array(self.times), np.vstack(self.backlogged)
