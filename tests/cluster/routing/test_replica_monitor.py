"""The replica monitor alone (no Ray): the replica count comes from the set of replicas Serve routes
to, and the controller's status is asked only every STATUS_EVERY polls or while that set is unknown."""

from __future__ import annotations

from types import SimpleNamespace

from cluster.routing import live_replicas
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.replica_monitor import STATUS_EVERY, ReplicaMonitor
from cluster.telemetry.metrics import ClusterMetrics
from tenancy import FairQueue, default_tenancy_config

APP, DEPLOYMENT = "monitor-test", "Replica"


class _Handle:
    app_name, deployment_name = APP, DEPLOYMENT

    def __init__(self) -> None:
        self.load = SimpleNamespace(remote=self._load)

    async def _load(self) -> dict:
        return {"replica_id": "r1", "running": 0}


def _monitor(counts: list[tuple[int, int]]) -> tuple[ReplicaMonitor, Dispatcher, list[int]]:
    """A monitor whose controller answers `counts[-1]`; the list of calls made comes back too."""
    dispatcher = Dispatcher(FairQueue.from_config(default_tenancy_config()), 2, replicas=1)
    calls: list[int] = []

    def count() -> tuple[int, int]:
        calls.append(1)
        return counts[-1]

    monitor = ReplicaMonitor(_Handle(), dispatcher, ClusterMetrics(), 0.05, count, model="m")
    return monitor, dispatcher, calls


async def test_the_controller_is_asked_every_poll_while_the_routed_set_is_unknown_or_empty() -> None:
    live_replicas._LIVE.pop((APP, DEPLOYMENT), None)
    counts = [(3, 2)]
    monitor, dispatcher, calls = _monitor(counts)
    try:
        for _ in range(4):
            await monitor.poll_once()
        assert len(calls) == 4
        assert monitor.replicas == 3 and dispatcher.capacity == 3  # 2 slots x 3 replicas / 2 routers
        live_replicas.publish(APP, DEPLOYMENT, frozenset())  # every replica stopping
        counts.append((0, 2))
        await monitor.poll_once()
        assert len(calls) == 5 and monitor.replicas == 0
    finally:
        live_replicas._LIVE.pop((APP, DEPLOYMENT), None)


async def test_between_status_calls_the_routed_set_sets_the_count() -> None:
    counts = [(2, 1)]
    monitor, dispatcher, calls = _monitor(counts)
    live_replicas.publish(APP, DEPLOYMENT, frozenset({"r1", "r2"}))
    try:
        for _ in range(STATUS_EVERY + 1):  # status calls at the first poll and STATUS_EVERY later
            await monitor.poll_once()
        assert len(calls) == 2
        assert monitor.replicas == 2 and dispatcher.capacity == 4
        live_replicas.publish(APP, DEPLOYMENT, frozenset({"r1", "r2", "r3"}))  # one more is routed to
        counts.append((3, 2))  # and a second router started
        await monitor.poll_once()
        assert len(calls) == 2  # not asked: the set's size is the count
        assert monitor.replicas == 3 and dispatcher.capacity == 6
        for _ in range(STATUS_EVERY - 1):  # up to the next status call
            await monitor.poll_once()
        assert len(calls) == 3 and dispatcher.capacity == 3  # the router count came with it
    finally:
        live_replicas._LIVE.pop((APP, DEPLOYMENT), None)
