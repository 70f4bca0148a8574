"""The SLA and usage answers of the HTTP edge: from the ledger when the app has one (every router
reads the same rows, so every router answers alike), else from this router's memory.

Without ``from``, a report starts where this router's window does (its start or its last
``/admin/timings/reset``), as the memory report always did; give ``from``/``to`` for a range that
is the same on every router. Before reading the ledger a view flushes this router's writer, at most
once per tenant per few seconds and never waiting long (``view_flush.py``); the answer says how in
its ``x-ledger-flush`` header, and in a JSON body's ``flush`` when the flush did not complete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from weakref import WeakKeyDictionary

from fastapi.responses import Response

from cluster.config import AppConfig
from cluster.edge.finite_json import FiniteJSON
from cluster.edge.tenant_views import sla_report, usage
from cluster.edge.view_flush import FlushOutcome, ViewFlush
from cluster.errors import classify
from cluster.ledger.router_ledger import RouterLedger
from cluster.ledger.rows import Pricing
from cluster.ledger.sla_query import ledger_sla
from cluster.ledger.store import LedgerStore
from cluster.ledger.time_range import TimeRange, bucket_width, time_range
from cluster.ledger.usage_query import usage_csv, usage_page, usage_rows
from cluster.routing.router_core import RouterCore
from tenancy import TenancyConfig, Tenant

log = logging.getLogger(__name__)
FLUSH_HEADER = "x-ledger-flush"
# Each ledger's flush windows (one ledger per router); a test may set its own ``ViewFlush``.
VIEW_FLUSHES: WeakKeyDictionary[RouterLedger, ViewFlush] = WeakKeyDictionary()


def model_pricing(core: RouterCore) -> Callable[[str], Pricing]:
    """A model's price and room now (the tenancy can be reloaded): what a request's slot costs."""

    def pricing(model: str) -> Pricing:
        pool = core.pools.get(model)
        room = pool.dispatcher.room if pool is not None else 1
        return Pricing(core.tenancy.config.gpu_dollars_per_hour, room)

    return pricing


def start_ledger(config: AppConfig, app: str, router: str, core: RouterCore) -> RouterLedger | None:
    """This router's ledger, fed by its timing recorder; None when the config turns it off."""
    if not config.ledger:
        return None
    pricing = model_pricing(core)
    try:
        tenancy = lambda: core.tenancy.config  # noqa: E731 - the SLA targets now (reloads included)
        ledger = RouterLedger(config, app, router, pricing, core.metrics.registry, tenancy=tenancy)
    except Exception as exc:  # an unwritable cache folder: serve, say so, report from memory
        log.error("ledger off on this router: %s", exc)
        return None
    core.recorder.sink = ledger.record
    ledger.start()
    return ledger


def record_refusal(
    ledger: RouterLedger | None,
    request_id: str,
    tenant: Tenant | None,
    key_id: str,
    model: str,
    exc: Exception,
) -> None:
    """A request refused after auth and before admission is a ledger row (no tenant: no row)."""
    if ledger is not None and tenant is not None:
        ledger.reject(request_id, tenant, key_id, model, classify(exc).code)


async def sla(
    ledger: RouterLedger | None, core: RouterCore, query: dict[str, str], tenant_id: str | None
) -> Response:
    """The SLA report (one tenant's, or every tenant's for the admin)."""
    recorder = core.recorder
    rng = time_range(query, recorder.started_wall, time.time())  # a bad range is a 400 either way
    if ledger is not None:
        try:
            flushed = await _flush(ledger, tenant_id)  # this router's own rows first, within bounds
            config, app, router = core.tenancy.config, ledger.app, ledger.router
            # The queries and the answer's JSON on the ledger's thread: a long report never holds
            # the router's loop (issue 22).
            answer = await ledger.query(
                lambda store: _sla_answer(store, config, rng, app, router, tenant_id, flushed)
            )
            return _said(answer, flushed)
        except Exception as exc:  # the database away: this router's memory, said so
            log.warning("ledger report failed (%s); answering from memory", type(exc).__name__)
    body = sla_report(recorder, core.tenancy.config, tenant_id, model_pricing(core))
    return FiniteJSON(body | {"source": "memory", "ledger": ledger.state if ledger else "off"})


async def usage_answer(
    ledger: RouterLedger | None, core: RouterCore, query: dict[str, str], tenant_id: str | None
) -> Response:
    """Usage buckets (JSON like OpenAI's Usage API, or ``format=csv``) of one tenant or of all."""
    rng = time_range(query, core.recorder.started_wall, time.time())
    width = bucket_width(query)
    if ledger is not None:
        try:
            flushed = await _flush(ledger, tenant_id)
            config, app, router = core.tenancy.config, ledger.app, ledger.router
            csv = query.get("format") == "csv"
            answer = await ledger.query(
                lambda store: _usage_answer(store, config, rng, width, app, router, tenant_id, csv, flushed)
            )
            return _said(answer, flushed)
        except Exception as exc:
            log.warning("ledger usage failed (%s); answering from memory", type(exc).__name__)
    records = core.recorder.records()
    tenants = [tenant_id] if tenant_id else sorted({r.tenant_id for r in records})
    if tenant_id:
        return FiniteJSON(usage(records, tenant_id) | {"source": "memory"})
    return FiniteJSON({"tenants": [usage(records, t) for t in tenants], "source": "memory"})


async def _flush(ledger: RouterLedger, tenant_id: str | None) -> FlushOutcome:
    """Flush the ledger's writer for a call of ``tenant_id`` (None for the admin) if its window
    allows, waiting a bounded time (``view_flush.py``)."""
    gate = VIEW_FLUSHES.get(ledger)
    if gate is None:
        gate = VIEW_FLUSHES[ledger] = ViewFlush()
    return await gate.flush(ledger.writer.flush, tenant_id)


def _said(answer: Response, flushed: FlushOutcome) -> Response:
    """The flush's outcome in a header, which a CSV answer carries too."""
    answer.headers[FLUSH_HEADER] = flushed
    return answer


def _flush_note(flushed: FlushOutcome) -> dict[str, str]:
    """A body field only when the flush did not complete (the answer may miss this router's last
    rows): otherwise every router's body stays the same for the same range."""
    return {} if flushed in ("flushed", "skipped") else {"flush": flushed}


async def _sla_answer(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    app: str,
    router: str,
    tenant_id: str | None,
    flushed: FlushOutcome,
) -> Response:
    """On the ledger's thread: the SLA report and its JSON."""
    report, method = await ledger_sla(store, config, rng, app, tenant_id)
    where = {"source": "ledger", "from": rng.start, "to": rng.end, "router": router, "percentiles": method}
    return FiniteJSON(report.to_dict() | where | _flush_note(flushed))


async def _usage_answer(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    width: int,
    app: str,
    router: str,
    tenant_id: str | None,
    csv: bool,
    flushed: FlushOutcome,
) -> Response:
    """On the ledger's thread: the usage buckets and their JSON (or CSV)."""
    results, outcomes = await usage_rows(store, rng, width, config, app, tenant_id)
    if csv:
        return Response(usage_csv(results), media_type="text/csv")
    page = usage_page(results, outcomes, rng, width)
    where = {"tenant_id": tenant_id or "*", "source": "ledger", "router": router}
    return FiniteJSON(page | where | _flush_note(flushed))
