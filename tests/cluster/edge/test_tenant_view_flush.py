"""The SLA and usage views flush the ledger within bounds (issue 43): at most once per tenant per
window (a call inside it reads without flushing, and says so; the admin's calls always flush), one
flush at a time, and a flush that does not return holds no view past its timeout (the view answers
from what is written, and says so).
A real router ledger on SQLite; the router around it is the little the views read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from cluster.config import AppConfig
from cluster.edge import ledger_views
from cluster.edge.view_flush import FLUSH_EVERY_S, ViewFlush
from cluster.ledger.router_ledger import RouterLedger
from cluster.ledger.rows import Pricing
from cluster.ledger.writer import WriterSettings
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import default_tenancy_config
from tests.cluster.ledger.rows_factory import timings
from tests.cluster.routing.test_stream_channel import until

CONFIG = default_tenancy_config()
ONLY_FLUSHES_WRITE = WriterSettings(interval_s=60.0, batch_rows=100_000)
View = Callable[..., Awaitable[Any]]


class CountedFlush:
    """The writer's flush, counted; ``hang`` makes the next ones wait until ``release``."""

    def __init__(self, real: Callable[[], Awaitable[None]]) -> None:
        self._real = real
        self.calls = 0
        self.finished = 0
        self._open = asyncio.Event()
        self._open.set()

    async def __call__(self) -> None:
        self.calls += 1
        try:
            await self._open.wait()
            await self._real()
        finally:
            self.finished += 1

    def hang(self) -> None:
        self._open.clear()

    async def release(self) -> None:
        """Let the hung flushes go, and wait until they are done (before the ledger closes)."""
        self._open.set()
        await until(lambda: self.finished == self.calls)


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[RouterLedger]:
    config = AppConfig(ledger_path=str(tmp_path / "ledger.sqlite"), ledger_spill_dir=str(tmp_path / "spill"))
    ledger = RouterLedger(config, "app", "r1", lambda _m: Pricing(5.0, 4), settings=ONLY_FLUSHES_WRITE)
    ledger.start()
    await ledger.writer.flush()  # the writer's first write migrates: the tables exist
    try:
        yield ledger
    finally:
        await ledger.close()


def _core() -> Any:
    return SimpleNamespace(recorder=TimingRecorder(), tenancy=SimpleNamespace(config=CONFIG), pools={})


QUERY = {"from": str(int(time.time()) - 3600)}  # the made-up requests of the last 30 s


async def _call(view: View, ledger: RouterLedger, tenant: str | None, **query: str) -> tuple[str, dict | str]:
    """A view's flush outcome (its header) and its body, within a bound a hung flush would pass."""
    answer = await asyncio.wait_for(view(ledger, _core(), QUERY | query, tenant), 10.0)
    assert answer.status_code == 200
    body = answer.body.decode() if query.get("format") == "csv" else orjson.loads(answer.body)
    if isinstance(body, dict):
        assert body["source"] == "ledger"
        # The body says so too when the flush did not complete; else it is every router's alike.
        flushed = answer.headers["x-ledger-flush"]
        assert body.get("flush") == (None if flushed in ("flushed", "skipped") else flushed)
    return answer.headers["x-ledger-flush"], body


def _requests(report: dict, tenant: str) -> int:
    return sum(t["requests"] for t in report["tenants"] if t["tenant_id"] == tenant)


async def test_a_tenant_calling_in_a_loop_flushes_once_per_window(ledger: RouterLedger) -> None:
    flush = CountedFlush(ledger.writer.flush)
    ledger.writer.flush = flush  # type: ignore[method-assign]
    served = timings(60)
    for t in served:
        ledger.record(t)
    alice_served = sum(t.tenant_id == "alice" for t in served)
    flushed, report = await _call(ledger_views.sla, ledger, "alice")
    assert flushed == "flushed" and _requests(report, "alice") == alice_served  # it read what it served
    for _ in range(20):
        assert (await _call(ledger_views.sla, ledger, "alice"))[0] == "skipped"
        assert (await _call(ledger_views.usage_answer, ledger, "alice"))[0] == "skipped"
    assert flush.calls == 1
    assert (await _call(ledger_views.usage_answer, ledger, "alice", format="csv"))[0] == "skipped"
    assert (await _call(ledger_views.sla, ledger, "bob"))[0] == "flushed"  # a window of its own
    assert flush.calls == 2
    for _ in range(3):  # the admin is trusted: every call flushes (within the timeout)
        assert (await _call(ledger_views.sla, ledger, None))[0] == "flushed"
    assert flush.calls == 5


async def test_a_callers_window_passes(ledger: RouterLedger) -> None:
    now = [0.0]
    ledger_views.VIEW_FLUSHES[ledger] = ViewFlush(clock=lambda: now[0])
    flush = CountedFlush(ledger.writer.flush)
    ledger.writer.flush = flush  # type: ignore[method-assign]
    assert (await _call(ledger_views.usage_answer, ledger, "alice"))[0] == "flushed"
    now[0] += FLUSH_EVERY_S - 0.01
    assert (await _call(ledger_views.usage_answer, ledger, "alice"))[0] == "skipped"
    now[0] += 0.01
    assert (await _call(ledger_views.usage_answer, ledger, "alice"))[0] == "flushed"
    assert flush.calls == 2


async def test_a_flush_that_does_not_return_holds_no_view(ledger: RouterLedger) -> None:
    ledger_views.VIEW_FLUSHES[ledger] = ViewFlush(timeout_s=0.1)
    served = timings(40)
    for t in served:
        ledger.record(t)
    await ledger.writer.flush()  # written before the database stops answering
    flush = CountedFlush(ledger.writer.flush)
    ledger.writer.flush = flush  # type: ignore[method-assign]
    flush.hang()
    flushed, report = await _call(ledger_views.sla, ledger, "alice")
    assert flushed == "timeout"
    assert _requests(report, "alice") == sum(t.tenant_id == "alice" for t in served)  # what is written
    assert (await _call(ledger_views.usage_answer, ledger, "bob"))[0] == "timeout"
    assert flush.calls == 1  # bob waited on the flush already running, started none
    await flush.release()


async def test_the_default_bound_answers_a_view_whose_flush_hangs(ledger: RouterLedger) -> None:
    """The same without a test's own settings: the router's defaults bound the wait."""
    flush = CountedFlush(ledger.writer.flush)
    ledger.writer.flush = flush  # type: ignore[method-assign]
    flush.hang()
    answer = await asyncio.wait_for(ledger_views.sla(ledger, _core(), QUERY, "alice"), 10.0)
    assert answer.status_code == 200 and orjson.loads(answer.body)["source"] == "ledger"
    await flush.release()


async def test_a_failed_flush_still_reads_the_ledger(ledger: RouterLedger) -> None:
    async def broken() -> None:
        raise ConnectionResetError("database gone mid-write")

    ledger.writer.flush = broken  # type: ignore[method-assign]
    flushed, report = await _call(ledger_views.sla, ledger, "alice")
    assert flushed == "failed" and report["tenants"] == []
