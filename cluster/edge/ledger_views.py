"""The SLA and usage answers of the HTTP edge: from the ledger when the app has one (every router
reads the same rows, so every router answers alike), else from this router's memory.

Without ``from``, a report starts where this router's window does (its start or its last
``/admin/timings/reset``), as the memory report always did; give ``from``/``to`` for a range that
is the same on every router.
"""

from __future__ import annotations

import logging
import time

from fastapi.responses import JSONResponse, Response

from cluster.config import AppConfig
from cluster.edge.tenant_views import sla_report, usage
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


def start_ledger(config: AppConfig, app: str, router: str, core: RouterCore) -> RouterLedger | None:
    """This router's ledger, fed by its timing recorder; None when the config turns it off."""
    if not config.ledger:
        return None

    def pricing(model: str) -> Pricing:
        pool = core.pools.get(model)
        room = pool.dispatcher.room if pool is not None else 1
        return Pricing(core.tenancy.config.gpu_dollars_per_hour, room)

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
            await ledger.writer.flush()  # this router's own rows first: it reads what it served
            config, app, router = core.tenancy.config, ledger.app, ledger.router
            # The queries and the answer's JSON on the ledger's thread: a long report never holds
            # the router's loop (issue 22).
            return await ledger.query(lambda store: _sla_answer(store, config, rng, app, router, tenant_id))
        except Exception as exc:  # the database away: this router's memory, said so
            log.warning("ledger report failed (%s); answering from memory", type(exc).__name__)
    body = sla_report(recorder, core.tenancy.config, tenant_id)
    return JSONResponse(body | {"source": "memory", "ledger": ledger.state if ledger else "off"})


async def usage_answer(
    ledger: RouterLedger | None, core: RouterCore, query: dict[str, str], tenant_id: str | None
) -> Response:
    """Usage buckets (JSON like OpenAI's Usage API, or ``format=csv``) of one tenant or of all."""
    rng = time_range(query, core.recorder.started_wall, time.time())
    width = bucket_width(query)
    if ledger is not None:
        try:
            await ledger.writer.flush()
            config, app, router = core.tenancy.config, ledger.app, ledger.router
            csv = query.get("format") == "csv"
            return await ledger.query(
                lambda store: _usage_answer(store, config, rng, width, app, router, tenant_id, csv)
            )
        except Exception as exc:
            log.warning("ledger usage failed (%s); answering from memory", type(exc).__name__)
    records = core.recorder.records()
    tenants = [tenant_id] if tenant_id else sorted({r.tenant_id for r in records})
    if tenant_id:
        return JSONResponse(usage(records, tenant_id) | {"source": "memory"})
    return JSONResponse({"tenants": [usage(records, t) for t in tenants], "source": "memory"})


async def _sla_answer(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    app: str,
    router: str,
    tenant_id: str | None,
) -> Response:
    """On the ledger's thread: the SLA report and its JSON."""
    report, method = await ledger_sla(store, config, rng, app, tenant_id)
    where = {"source": "ledger", "from": rng.start, "to": rng.end, "router": router, "percentiles": method}
    return JSONResponse(report.to_dict() | where)


async def _usage_answer(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    width: int,
    app: str,
    router: str,
    tenant_id: str | None,
    csv: bool,
) -> Response:
    """On the ledger's thread: the usage buckets and their JSON (or CSV)."""
    results, outcomes = await usage_rows(store, rng, width, config, app, tenant_id)
    if csv:
        return Response(usage_csv(results), media_type="text/csv")
    page = usage_page(results, outcomes, rng, width)
    return JSONResponse(page | {"tenant_id": tenant_id or "*", "source": "ledger", "router": router})
