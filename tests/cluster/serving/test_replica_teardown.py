"""A replica whose __init__ failed partway (an engine that could not load, a graph that could not be
captured) is still destroyed by Serve, which awaits its async destructor: that must stop what the
replica had made and raise nothing for what it had not."""

from __future__ import annotations

import asyncio

from cluster.serving.replica_deployment import ReplicaServer


class Stoppable:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def stop(self) -> None:
        self.calls.append("stop")

    async def close(self) -> None:
        self.calls.append("close")


def test_a_replica_that_never_finished_init_is_destroyed_cleanly() -> None:
    replica = ReplicaServer.__new__(ReplicaServer)  # __init__ raised before setting anything
    asyncio.run(replica.__del__())


def test_a_replica_torn_down_after_its_engine_started_stops_it() -> None:
    replica = ReplicaServer.__new__(ReplicaServer)
    replica._engine, replica._channels = Stoppable(), Stoppable()  # init got this far, then failed
    asyncio.run(replica.__del__())
    assert replica._engine.calls == ["stop"]
    assert replica._channels.calls == ["close"]


class DirectStreams:
    """A submit server whose streams outlast any fixed wait: records how long the replica waited."""

    def __init__(self) -> None:
        self.waited: list[float] = []
        self.stopped = False

    async def drain(self, timeout_s: float) -> None:
        self.waited.append(timeout_s)

    async def stop(self) -> None:
        self.stopped = True


def test_a_stopping_replica_waits_for_its_direct_streams_as_long_as_serve_lets_it() -> None:
    # Serve's graceful bound covers the longest answer (minutes on a slow box); a shorter fixed wait
    # cut the streams still running with a ConnectionError before Serve would have stopped them.
    replica = ReplicaServer.__new__(ReplicaServer)
    replica._submit, replica._drain_s = DirectStreams(), 830.0
    asyncio.run(replica.__del__())
    assert replica._submit.waited == [830.0] and replica._submit.stopped
