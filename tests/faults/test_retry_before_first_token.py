"""The retry path of fault 2, made deterministic with a fake replica handle: a replica that fails
before the first token is invisible to the client; one that fails after it is an explicit error;
either way the slot and the quota lease come back and the ending is recorded once."""

from __future__ import annotations

import pytest

from cluster.errors import ReplicaFailure
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.request_flow import RequestRunner
from cluster.routing.request_job import Job, Timeouts
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import FairQueue, MemoryQuotaStore, QuotaManager, default_tenancy_config


class FakeStream:
    def __init__(self, items: list) -> None:
        self._items = list(items)
        self.cancelled = False

    def __anext__(self):
        return self._next()

    async def _next(self):
        if not self._items:
            raise StopAsyncIteration
        item = self._items.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class FakeReplicas:
    """``options(stream=True).generate.remote(args)`` hands out the scripted streams in turn."""

    def __init__(self, scripts: list[list]) -> None:
        self.streams = [FakeStream(s) for s in scripts]
        self.calls: list[str] = []
        self.generate = self

    def options(self, **_):
        return self

    def remote(self, args):
        self.calls.append(args.request_id)
        return self.streams[len(self.calls) - 1]


def _item(n: int, finish: str | None = None) -> dict:
    return {
        "token_ids": [1],
        "text": "x",
        "finish_reason": finish,
        "num_prompt_tokens": 3,
        "num_output_tokens": n,
        "index": 0,
        "total_output_tokens": n,
        "done": finish is not None,
        "replica_id": "r",
    }


def _runner(replicas: FakeReplicas, retries: int = 2):
    config = default_tenancy_config()
    store = MemoryQuotaStore()
    quotas = QuotaManager(config, store)
    dispatcher = Dispatcher(FairQueue.from_config(config), room_per_replica=2)
    runner = RequestRunner(
        quotas, dispatcher, replicas, ClusterMetrics(), TimingRecorder(), Timeouts(5.0, 5.0, retries)
    )
    return runner, config, store


async def test_failure_before_the_first_token_is_retried_invisibly() -> None:
    died = RuntimeError("ActorDiedError")
    replicas = FakeReplicas([[died], [died], [_item(1), _item(2, "stop")]])
    runner, config, store = _runner(replicas)
    tenant = config.tenants[0]
    active = await runner.open(Job("req1", tenant, tenant.sla_class, [1, 2, 3], {"max_tokens": 2}))
    items = [i async for i in active.outputs()]
    assert [i["finish_reason"] for i in items] == [None, "stop"]
    assert replicas.calls == ["req1", "req1-r1", "req1-r2"]  # fresh engine ids on retries
    assert replicas.streams[0].cancelled and replicas.streams[1].cancelled
    assert active.retries == 2
    line = f'fairlane_retries_total{{sla_class="{tenant.sla_class}",tenant="{tenant.id}"}} 2.0'
    assert line in runner.metrics.render().decode()
    [record] = runner.recorder.records()
    assert record.outcome == "ok" and runner.dispatcher.in_flight == 0
    assert store.active_leases(tenant.id) == 0


async def test_failure_after_the_first_token_is_an_explicit_error_and_releases_everything() -> None:
    replicas = FakeReplicas([[_item(1), RuntimeError("ActorDiedError")]])
    runner, config, store = _runner(replicas)
    tenant = config.tenants[0]
    active = await runner.open(Job("req2", tenant, tenant.sla_class, [1, 2, 3], {"max_tokens": 8}))
    with pytest.raises(ReplicaFailure):
        async for _ in active.outputs():
            pass
    [record] = runner.recorder.records()
    assert record.outcome == "error" and record.reason == "replica_error"
    assert runner.dispatcher.in_flight == 0 and store.active_leases(tenant.id) == 0
    assert replicas.calls == ["req2"]  # never retried once a token went out


async def test_retries_are_bounded() -> None:
    died = RuntimeError("ActorDiedError")
    replicas = FakeReplicas([[died], [died]])
    runner, config, store = _runner(replicas, retries=1)
    tenant = config.tenants[0]
    with pytest.raises(ReplicaFailure):
        await runner.open(Job("req3", tenant, tenant.sla_class, [1, 2, 3], {"max_tokens": 2}))
    [record] = runner.recorder.records()
    assert record.outcome == "error" and len(replicas.calls) == 2
    assert runner.dispatcher.in_flight == 0 and store.active_leases(tenant.id) == 0


async def test_an_engine_abort_is_an_error_not_a_success() -> None:
    """Issue 19, defect 1: a replica whose engine ends a request with "abort" (shutdown, drain) after
    tokens went out: the client gets an explicit error and the SLA report counts a failure."""
    aborted = {**_item(2, "abort"), "done": True}
    replicas = FakeReplicas([[_item(1), aborted]])
    runner, config, store = _runner(replicas)
    tenant = config.tenants[0]
    active = await runner.open(Job("req4", tenant, tenant.sla_class, [1, 2, 3], {"max_tokens": 8}))
    with pytest.raises(ReplicaFailure):
        async for _ in active.outputs():
            pass
    [record] = runner.recorder.records()
    assert record.outcome == "error" and record.reason == "replica_error"
    assert runner.dispatcher.in_flight == 0 and store.active_leases(tenant.id) == 0


async def test_an_abort_before_the_first_token_is_retried_on_another_replica() -> None:
    replicas = FakeReplicas(
        [[{"error": {"kind": "aborted", "message": "replica stopping"}}], [_item(1, "stop")]]
    )
    runner, config, _store = _runner(replicas)
    tenant = config.tenants[0]
    active = await runner.open(Job("req5", tenant, tenant.sla_class, [1, 2, 3], {"max_tokens": 1}))
    assert [i["finish_reason"] async for i in active.outputs()] == ["stop"]
    assert replicas.calls == ["req5", "req5-r1"]
