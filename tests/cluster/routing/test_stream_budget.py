"""A router's stream-item budget (``stream_items_per_s``): the more streams it has open, the further
apart each new stream's items travel, so its per-item CPU stays bounded; without a budget, nothing
changes. The replica side of the spacing is ``test_stream_batching.py``'s."""

from __future__ import annotations

import asyncio

import pytest

from cluster.config import AppConfig
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.request_flow import MAX_STREAM_INTERVAL_S, RequestRunner, stream_interval
from cluster.routing.request_job import Job, Timeouts
from cluster.serving.wire import GenerateArgs
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import FairQueue, MemoryQuotaStore, QuotaManager, default_tenancy_config


def test_the_interval_is_the_floor_until_the_budget_is_shared_out() -> None:
    assert stream_interval(0.05, 500, 0.0) == 0.05  # no budget: the configured spacing
    assert stream_interval(0.05, 10, 1000.0) == 0.05  # 10 streams share 1000 items/s: the floor binds
    assert stream_interval(0.05, 200, 1000.0) == pytest.approx(0.2)  # 200 streams: 5 items/s each
    assert stream_interval(0.0, 10**6, 1000.0) == MAX_STREAM_INTERVAL_S  # never coarser than 1 s
    assert AppConfig().stream_items_per_s == 1000.0  # on by default: a few streams never feel it


class _Stream:
    """One replica stream that ends at once: a single finished item."""

    def __init__(self) -> None:
        self._items = [
            {"token_ids": [7], "num_output_tokens": 1, "finish_reason": "length", "text": "x", "index": 0}
            | {"total_output_tokens": 1, "done": True}
        ]

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> dict:
        if not self._items:
            raise StopAsyncIteration
        return self._items.pop()

    def cancel(self) -> None:
        pass


class _Generate:
    def __init__(self) -> None:
        self.sent: list[GenerateArgs] = []

    def remote(self, args: GenerateArgs) -> _Stream:
        self.sent.append(args)
        return _Stream()


class _Handle:
    def __init__(self) -> None:
        self.generate = _Generate()

    def options(self, **_: object) -> _Handle:
        return self


async def _coalesce_with_open(open_before: int, items_per_s: float) -> float:
    """The spacing a new stream is sent with while ``open_before`` others hold dispatch slots."""
    config = default_tenancy_config()
    tenant = config.tenants[0]
    quotas = QuotaManager(config, MemoryQuotaStore())
    dispatcher = Dispatcher(FairQueue.from_config(config), room_per_replica=1000)
    handle = _Handle()
    runner = RequestRunner(
        quotas,
        dispatcher,
        handle,  # type: ignore[arg-type]
        ClusterMetrics(),
        TimingRecorder(),
        Timeouts(5.0, 5.0),
        stream_items_per_s=items_per_s,
    )
    dispatcher.in_flight = open_before  # other streams already dispatched by this router
    job = Job("req-1", tenant, tenant.sla_class, [1, 2, 3], {"max_tokens": 1}, coalesce_s=0.05)
    active = await runner.open(job)
    async for _ in active.outputs():
        pass
    assert dispatcher.in_flight == open_before  # the slot was given back
    return handle.generate.sent[-1].coalesce_s


def test_a_router_spaces_new_streams_by_its_open_streams() -> None:
    # The new stream is the 400th open one: 1000 items/s over 400 streams = one item per 0.4 s.
    assert asyncio.run(_coalesce_with_open(399, 1000.0)) == pytest.approx(0.4)
    assert asyncio.run(_coalesce_with_open(0, 1000.0)) == 0.05  # alone: the job's own spacing
    assert asyncio.run(_coalesce_with_open(399, 0.0)) == 0.05  # no budget: the job's own spacing
