"""``StatusMetrics`` counts error answers by route and status, and a client that left before any
answer started (the router's call cancelled) as 499; a cancel after an answer started is not one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from cluster.telemetry.status_metrics import StatusMetrics

SCOPE = {"type": "http", "path": "/v1/chat/completions"}


def _counter() -> Counter:
    return Counter("errors", "test", ("route", "status"), registry=CollectorRegistry())


def _count(counter: Counter, status: str) -> float:
    return counter.labels("/v1/chat/completions", status)._value.get()


async def _noop_send(message: dict[str, Any]) -> None:
    return None


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b""}


def _app(status: int | None, started: asyncio.Event) -> Callable:
    """An app that answers ``status`` (None: nothing) and then waits until cancelled."""

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if status is not None:
            await send({"type": "http.response.start", "status": status, "headers": []})
        started.set()
        await asyncio.Event().wait()

    return app


async def _cancelled(status: int | None) -> Counter:
    counter, started = _counter(), asyncio.Event()
    call = asyncio.create_task(
        StatusMetrics(_app(status, started), lambda: counter)(SCOPE, _receive, _noop_send)
    )
    await asyncio.wait_for(started.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    return counter


async def test_a_client_gone_before_any_answer_is_a_499() -> None:
    counter = await _cancelled(None)
    assert _count(counter, "499") == 1.0


async def test_a_client_gone_mid_stream_is_not_a_499() -> None:
    counter = await _cancelled(200)
    assert _count(counter, "499") == 0.0


async def test_an_error_answer_is_counted_by_its_status_and_a_cancel_after_it_adds_no_499() -> None:
    counter = await _cancelled(404)
    assert (_count(counter, "404"), _count(counter, "499")) == (1.0, 0.0)
