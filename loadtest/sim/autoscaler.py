"""Serve's default autoscaling policy, on simulated time.

Every ``metrics_interval_s`` the total ongoing requests on running replicas is sampled; the
decision averages the samples of the last ``look_back_period_s``: desired =
ceil(average / target_ongoing_requests), clamped to [min, max]. A scale-up happens once desired
has stayed above the current target for ``upscale_delay_s`` (consecutive decisions), a scale-down
once it stayed below for ``downscale_delay_s``; any decision the other way (or equal) resets the
count. New replicas serve after ``replica_start_s``; removed ones drain their requests first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from loadtest.sim.events import EventLoop
from loadtest.sim.pool import ReplicaPool
from loadtest.sim.spec import AutoscalingSpec


class Autoscaler:
    def __init__(
        self, loop: EventLoop, pool: ReplicaPool, spec: AutoscalingSpec, keep_running: Callable[[], bool]
    ) -> None:
        self._loop, self._pool, self._spec = loop, pool, spec
        self._keep_running = keep_running
        self._samples: deque[tuple[float, int]] = deque()
        self._up = 0
        self._down = 0
        self.decisions: list[tuple[float, int]] = []  # (time, new target)

    def start(self) -> None:
        self._loop.after(self._spec.metrics_interval_s, self._tick)

    def desired(self) -> int:
        s = self._spec
        window = [v for _, v in self._samples]
        average = sum(window) / len(window) if window else 0.0
        return min(s.max_replicas, max(s.min_replicas, math.ceil(average / s.target_ongoing_requests)))

    def _tick(self) -> None:
        s, now = self._spec, self._loop.now
        self._samples.append((now, self._pool.total_ongoing()))
        while self._samples and self._samples[0][0] < now - s.look_back_period_s:
            self._samples.popleft()
        self._decide(self.desired())
        if self._keep_running():
            self._loop.after(s.metrics_interval_s, self._tick)

    def _decide(self, desired: int) -> None:
        s, current = self._spec, self._pool.target
        if desired > current:
            self._up, self._down = self._up + 1, 0
            if self._up * s.metrics_interval_s >= s.upscale_delay_s:
                self._scale(desired)
        elif desired < current:
            self._down, self._up = self._down + 1, 0
            if self._down * s.metrics_interval_s >= s.downscale_delay_s:
                self._scale(desired)
        else:
            self._up = self._down = 0

    def _scale(self, desired: int) -> None:
        current = self._pool.target
        if desired > current:
            self._pool.add(desired - current)
        else:
            self._pool.remove(current - desired)
        self._up = self._down = 0
        self.decisions.append((self._loop.now, desired))
