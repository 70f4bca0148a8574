"""Replica count over the run (for GPU-seconds): fairlane's ``/health`` reports it; else a fixed count."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx

POLL_INTERVAL_S = 1.0


def integrate(samples: list[tuple[float, int]], end: float) -> float:
    """Replica-seconds: each sample's count holds until the next sample (or ``end``)."""
    total = 0.0
    for (t, n), (t_next, _) in zip(samples, [*samples[1:], (end, 0)], strict=True):
        total += n * max(0.0, t_next - t)
    return total


class ReplicaPoller:
    def __init__(self, client: httpx.AsyncClient, fallback: int) -> None:
        self.client = client
        self.fallback = fallback
        self.samples: list[tuple[float, int]] = []
        self.replica_seconds = 0.0
        self._task: asyncio.Task | None = None

    async def count(self) -> int:
        try:
            r = await self.client.get("/health", timeout=5)
            n = r.json().get("replicas")
            return int(n) if isinstance(n, int) and n > 0 else self.fallback
        except (httpx.HTTPError, ValueError, AttributeError):
            return self.fallback

    def start(self, clock: Callable[[], float]) -> None:
        async def loop() -> None:
            while True:
                self.samples.append((clock(), await self.count()))
                await asyncio.sleep(POLL_INTERVAL_S)

        self.samples = [(0.0, self.fallback)]
        self._task = asyncio.create_task(loop())

    async def stop(self, end: float) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # The first real sample replaces the placeholder at t=0.
        if len(self.samples) > 1:
            self.samples = [(0.0, self.samples[1][1]), *self.samples[2:]]
        self.replica_seconds = integrate(self.samples, end)
