"""A client that leaves after auth and before admission (Serve cancels the router's handler while
it templates and tokenizes) ends its request exactly once: aborted, client_gone, in the timing
records, the ledger's sink and ``fairlane_requests_total``. Before, nothing recorded it, and the
disconnect storm's routers counted fewer endings than its clients sent (94 of 100 under load).
The router's real handler (``Ingress._serve``), with the little around it that it reads."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from cluster.edge.ingress import Ingress
from cluster.edge.openai_schemas import ChatCompletionRequest
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import default_tenancy_config

CONFIG = default_tenancy_config()
TENANT = CONFIG.tenants[0]


class HeldBuilder:
    """A job builder whose templating never ends until the test lets it (it never does)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def build_all(self, *_args) -> list:
        self.started.set()
        await asyncio.Event().wait()
        return []


def _router(builder: HeldBuilder, sink: list) -> SimpleNamespace:
    recorder = TimingRecorder()
    recorder.sink = sink.append
    pool = SimpleNamespace(name="smollm2", tenant=lambda tenant: tenant, runner=None)
    core = SimpleNamespace(
        recorder=recorder,
        metrics=ClusterMetrics(),
        tenancy=SimpleNamespace(config=CONFIG),
        resolve=lambda tenant, model: (pool, None),
    )
    return SimpleNamespace(
        core=core,
        ledger=None,
        drain=SimpleNamespace(draining=False),
        jobs={"smollm2": builder},
        cfg=SimpleNamespace(log_request_text=False),
        _tenant=lambda request: TENANT,
    )


def _request() -> Request:
    return Request({"type": "http", "headers": [(b"authorization", b"Bearer sk-test")], "path": "/"})


def _aborts(metrics: ClusterMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "fairlane_requests_total",
        {"tenant": TENANT.id, "sla_class": TENANT.sla_class, "outcome": "aborted"},
    )
    return value or 0.0


async def test_a_client_gone_while_its_prompt_is_templated_is_recorded_once_as_aborted() -> None:
    builder, sink = HeldBuilder(), []
    router = _router(builder, sink)
    body = ChatCompletionRequest(model="smollm2", messages=[{"role": "user", "content": "hi"}])
    handler = asyncio.create_task(Ingress._serve(router, _request(), body, "chat"))
    await asyncio.wait_for(builder.started.wait(), 10)
    assert router.core.recorder.records() == []  # nothing recorded while it is templated
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    [record] = router.core.recorder.records()
    assert (record.tenant_id, record.outcome, record.reason) == (TENANT.id, "aborted", "client_gone")
    assert record.model == "smollm2" and record.end is not None and record.first_token is None
    assert sink == [record]  # the ledger's row
    assert _aborts(router.core.metrics) == 1.0


async def test_a_client_gone_before_auth_is_no_tenants_request() -> None:
    builder, sink = HeldBuilder(), []
    router = _router(builder, sink)
    body = ChatCompletionRequest(model="smollm2", messages=[{"role": "user", "content": "hi"}])
    handler = asyncio.create_task(Ingress._serve(router, _request(), body, "chat"))
    handler.cancel()  # before its first step: nothing authenticated yet
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert router.core.recorder.records() == [] and sink == [] and _aborts(router.core.metrics) == 0.0
