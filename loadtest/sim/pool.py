"""The replica pool: replicas start (after a start time), serve, drain and stop; replica-seconds
are counted from creation to stop (what a GPU bill counts)."""

from __future__ import annotations

from collections.abc import Callable

from loadtest.sim.events import EventLoop
from loadtest.sim.replica import Job, ReplicaSpec, SimReplica


class ReplicaPool:
    def __init__(
        self,
        loop: EventLoop,
        spec: ReplicaSpec,
        on_finish: Callable[[Job, float], None],
        on_change: Callable[[int], None],
        start_s: float = 0.0,
    ) -> None:
        self._loop = loop
        self._spec = spec
        self._on_finish = on_finish
        self._on_change = on_change
        self._start_s = start_s
        self.ready: list[SimReplica] = []
        self.starting: list[SimReplica] = []
        self.draining: list[SimReplica] = []
        self._created: dict[int, float] = {}
        self._draining_by_index: dict[int, SimReplica] = {}
        self._all: dict[int, SimReplica] = {}
        self._next = 0
        self.replica_seconds = 0.0
        self.peak = 0

    @property
    def target(self) -> int:
        """Replicas that are or will be serving (ready + starting)."""
        return len(self.ready) + len(self.starting)

    def add(self, count: int, immediately: bool = False) -> None:
        for _ in range(count):
            r = SimReplica(self._next, self._spec, self._loop, self._finished)
            self._next += 1
            self._all[r.index] = r
            self._created[r.index] = self._loop.now
            if immediately or self._start_s == 0:
                self.ready.append(r)
            else:
                self.starting.append(r)
                self._loop.after(self._start_s, self._became_ready, r)
        self.peak = max(self.peak, self.target + len(self.draining))
        self._on_change(len(self.ready))

    def remove(self, count: int) -> None:
        """Scale down: starting replicas go first (newest first), then the newest ready ones drain."""
        for _ in range(count):
            if self.starting:
                self._stop(self.starting.pop())
            elif self.ready:
                r = self.ready.pop()
                if r.ongoing == 0:
                    self._stop(r)
                else:
                    self.draining.append(r)
                    self._draining_by_index[r.index] = r
        self._on_change(len(self.ready))

    def close(self) -> None:
        for r in self.ready + self.starting + self.draining:
            self._stop(r)

    def by_index(self, index: int) -> SimReplica:
        return self._all[index]

    def total_ongoing(self) -> int:
        return sum(r.ongoing for r in self.ready) + sum(r.ongoing for r in self.draining)

    def _became_ready(self, r: SimReplica) -> None:
        if r in self.starting:
            self.starting.remove(r)
            self.ready.append(r)
            self._on_change(len(self.ready))

    def _finished(self, job: Job, now: float) -> None:
        self._on_finish(job, now)
        r = self._draining_by_index.get(job.replica)
        if r is not None and r.ongoing == 0:
            del self._draining_by_index[r.index]
            self.draining.remove(r)
            self._stop(r)

    def _stop(self, r: SimReplica) -> None:
        created = self._created.pop(r.index, None)
        if created is not None:
            self.replica_seconds += self._loop.now - created
