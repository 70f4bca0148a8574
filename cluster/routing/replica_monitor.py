"""Periodic view of the replica deployment: how many replicas run, their load and profile.

The replica count sets the dispatcher's room (autoscaling changes it) and integrates the
replica-seconds that the SLA report prices. Load and profile polls go through the deployment
handle, so each poll reaches one replica chosen by the request router; over a few polls every
replica reports. Every call has a timeout; a failed poll keeps the previous view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.routing.dispatcher import Dispatcher
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder

log = logging.getLogger(__name__)
PROFILE_EVERY = 5  # polls between profile calls (the summary sorts the step history)
STALE_POLLS = 40  # a replica's load unseen for this many polls is dropped (each poll asks one replica)


def running_replicas(app_name: str, deployment: str) -> int | None:
    """RUNNING replicas of ``deployment`` from the Serve controller, or None when unknown."""
    status = serve.status()
    app = status.applications.get(app_name)
    if app is None or deployment not in app.deployments:
        return None
    states = app.deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))


class ReplicaMonitor:
    """Polls replica count, load and profile; feeds the dispatcher, metrics and the cost clock."""

    def __init__(
        self,
        handle: DeploymentHandle,
        dispatcher: Dispatcher,
        metrics: ClusterMetrics,
        recorder: TimingRecorder,
        interval_s: float,
        count: Callable[[], int | None],
        hooks: tuple[Callable[[], Awaitable[None]], ...] = (),
    ) -> None:
        self._handle = handle
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._recorder = recorder
        self._interval = interval_s
        self._count = count
        self._hooks = hooks  # per-poll duties of the router (drain flag, Redis reconnect probe)
        self.replicas = 0
        self.loads: dict[str, dict] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        polls = 0
        while True:
            await self.poll_once(profile=polls % PROFILE_EVERY == 0)
            polls += 1
            await asyncio.sleep(self._interval)

    async def poll_once(self, profile: bool = False) -> None:
        try:
            count = await asyncio.wait_for(asyncio.to_thread(self._count), self._interval * 5)
        except Exception as exc:  # the controller is busy or restarting: keep the previous count
            log.warning("replica count poll failed: %s", exc)
            count = None
        if count is not None:
            self.replicas = count
            self._dispatcher.set_replicas(count)
            self._metrics.replicas.set(count)
        self._recorder.tick_replicas(self.replicas)
        if self.replicas > 0:
            await self._poll_load(profile)
        for hook in self._hooks:
            await hook()
        d = self._dispatcher
        self._metrics.in_flight.set(d.in_flight)
        self._metrics.room.set(d.capacity)

    async def _poll_load(self, profile: bool) -> None:
        try:
            load = await asyncio.wait_for(self._handle.load.remote(), self._interval * 2)
            now = time.monotonic()
            self.loads[load["replica_id"]] = load | {"polled_at": now}
            # A replaced replica stops answering: its last load goes, so the map holds live ones only.
            stale = now - STALE_POLLS * self._interval
            self.loads = {rid: v for rid, v in self.loads.items() if v["polled_at"] >= stale}
            self._metrics.observe_load(load)
            if profile:
                summary = await asyncio.wait_for(self._handle.profile.remote(), self._interval * 2)
                self._metrics.observe_profile(summary)
        except Exception as exc:  # a replica being replaced; the next poll tries again
            log.debug("replica load poll failed: %s", exc)
