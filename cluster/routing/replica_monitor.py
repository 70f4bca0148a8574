"""Periodic view of each model's replica deployment: how many replicas run, their load and profile.

The replica count sets that model's dispatcher room (autoscaling changes it) and integrates the
replica-seconds that the SLA report prices. Load and profile polls go through the deployment
handle, so each poll reaches one replica chosen by the request router; over a few polls every
replica reports. Every call has a timeout; a failed poll keeps the previous view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.routing.dispatcher import Dispatcher
from cluster.routing.live_replicas import live_replicas
from cluster.routing.room_follower import RoomFollower
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder

log = logging.getLogger(__name__)
PROFILE_EVERY = 5  # polls between profile calls (the summary sorts the step history)
STALE_POLLS = 40  # a replica's load unseen for this many polls is dropped (each poll asks one replica)
# Polls between calls to the Serve controller's status while this process's request router routes
# to some replicas (their count is then the set's size). A status call pickles the app's whole
# state in this process: about 4% of a streaming router's samples when made every poll. Routers
# that start or stop reach the share of the room within STATUS_EVERY polls.
STATUS_EVERY = 5


def running_replicas(app_name: str, deployment: str) -> int | None:
    """RUNNING replicas of ``deployment`` from the Serve controller, or None when unknown."""
    return running_counts(app_name, (deployment,))[0]


def running_counts(app_name: str, deployments: Sequence[str]) -> tuple[int | None, ...]:
    """RUNNING replicas of each deployment (None when unknown), from one controller status call."""
    app = serve.status().applications.get(app_name)
    if app is None:
        return tuple(None for _ in deployments)
    return tuple(
        int(app.deployments[d].replica_states.get("RUNNING", 0)) if d in app.deployments else None
        for d in deployments
    )


class ReplicaMonitor:
    """Polls one model's replica count, load and profile; feeds its dispatcher and the metrics."""

    def __init__(
        self,
        handle: DeploymentHandle,
        dispatcher: Dispatcher,
        metrics: ClusterMetrics,
        interval_s: float,
        count: Callable[[], tuple[int | None, int | None]],
        model: str = "",
        room_set: int | None = None,
    ) -> None:
        """``count``: the model's running replicas and the app's running routers (None: unknown).
        ``room_set``: the model's ``replica_room``; None: the room follows the replicas' slots."""
        self._handle = handle
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._interval = interval_s
        self._count = count
        self.model = model
        self.replicas = 0
        self._polls = 0
        self.loads: dict[str, dict] = {}
        self.profiles: dict[str, dict] = {}  # replica id -> its last step-profile summary
        self.room = RoomFollower(model, room_set)

    @property
    def room_per_replica(self) -> int:
        return self._dispatcher.room

    async def poll_once(self, profile: bool = False) -> None:
        live = live_replicas(self._handle.app_name, self._handle.deployment_name)
        count = routers = None
        if not live or self._polls % STATUS_EVERY == 0:  # unknown, or empty: stopping or starting
            count, routers = await self._controller_counts()
        else:  # between status calls the routed-to set is the count (Serve pushes its changes)
            count = len(live)
        self._polls += 1
        if count is not None:
            self.replicas = count
            self._dispatcher.set_replicas(count)
            self._metrics.replicas.labels(self.model).set(count)
        if routers:  # 0 while this router itself is not yet RUNNING: keep the configured count
            self._dispatcher.set_routers(routers)
        if live:  # empty: every replica is stopping; their requests keep the room until they end
            self._dispatcher.set_live(live)
        if self.replicas > 0:
            await self._poll_load(profile)
        d = self._dispatcher
        self._metrics.in_flight.labels(self.model).set(d.in_flight)
        self._metrics.room.labels(self.model).set(d.capacity)

    async def _controller_counts(self) -> tuple[int | None, int | None]:
        """The model's RUNNING replicas and the app's RUNNING routers, from the Serve controller."""
        try:
            async with asyncio.timeout(self._interval * 5):  # not wait_for: it can swallow the stop's cancel
                return await asyncio.to_thread(self._count)
        except Exception as exc:  # the controller is busy or restarting: keep the previous counts
            log.warning("replica count poll failed (%s): %s", self.model, exc)
            return None, None

    async def _poll_load(self, profile: bool) -> None:
        try:
            async with asyncio.timeout(self._interval * 2):
                load = await self._handle.load.remote()
            now = time.monotonic()
            self.loads[load["replica_id"]] = load | {"model": self.model, "polled_at": now}
            # A replaced replica stops answering: its last load goes, so the map holds live ones only.
            stale = now - STALE_POLLS * self._interval
            self.loads = {rid: v for rid, v in self.loads.items() if v["polled_at"] >= stale}
            self._metrics.observe_load(load, self.model)
            room = self.room.room(self.loads)
            if room is not None:
                self._dispatcher.set_room(room)
            if profile:
                async with asyncio.timeout(self._interval * 2):
                    summary = await self._handle.profile.remote()
                self._metrics.observe_profile(summary, self.model)
                rid = str(summary.get("replica_id", "?"))
                self.profiles[rid] = summary | {"model": self.model, "polled_at": time.monotonic()}
                self.profiles = {r: v for r, v in self.profiles.items() if r in self.loads}
        except Exception as exc:  # a replica being replaced; the next poll tries again
            log.debug("replica load poll failed (%s): %s", self.model, exc)


class MonitorLoop:
    """The router's periodic duties: every model's replica poll, the replica-seconds clock, then the
    router-wide hooks (drain flag, Redis reconnect probes, counter sharing, tenancy version)."""

    def __init__(
        self,
        monitors: Sequence[ReplicaMonitor],
        recorder: TimingRecorder,
        interval_s: float,
        hooks: tuple[Callable[[], Awaitable[None]], ...] = (),
    ) -> None:
        self.monitors = tuple(monitors)
        self._recorder = recorder
        self._interval = interval_s
        self._hooks = hooks
        self._task: asyncio.Task | None = None

    @property
    def replicas(self) -> int:
        """Running replicas over every model."""
        return sum(m.replicas for m in self.monitors)

    @property
    def loads(self) -> dict[str, dict]:
        """Replica id -> its last polled load (each carries its ``model``)."""
        return {rid: load for m in self.monitors for rid, load in m.loads.items()}

    @property
    def profiles(self) -> dict[str, dict]:
        """Replica id -> its last step-profile summary (polled every PROFILE_EVERY polls)."""
        return {rid: summary for m in self.monitors for rid, summary in m.profiles.items()}

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
        for monitor in self.monitors:
            await monitor.poll_once(profile)
        self._recorder.tick_replicas({m.model: m.replicas for m in self.monitors})
        for hook in self._hooks:
            await hook()
