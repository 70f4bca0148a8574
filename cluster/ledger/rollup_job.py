"""The rollup job: rebuild closed hours of ``ledger_rollup`` from the rows, off the request path.

Why a job and not a fold inside each insert: the latency summary of an hour is a histogram per
(tenant, model, class, metric), which SQL builds in one pass over the hour's rows but which an
insert would have to read, merge and rewrite per batch, with every router contending for the same
rows. The writer's only part is a mark: the statement that stores rows also marks their (app, hour)
dirty, counting only rows actually inserted (a replay marks nothing). So at every instant an hour
with rows is either dirty or rolled up whole, and a report reads the rollup for clean hours only.

Rolling an hour is one transaction: read its marks' versions, rebuild its sums and histograms from
``ledger_requests``, then delete the marks still at the versions read. No stored row is lost: a
writer that stores a late row into the hour while it is rebuilt raises (or creates) its mark, so
the mark survives the delete (in PostgreSQL the delete waits for that writer's statement and sees
the new version; SQLite runs one writer at a time) and the hour is rolled again. A writer waits
for the job at most for that final delete. Rebuilding is idempotent: a replayed hour, a row sent
twice or two jobs never double count.
"""

from __future__ import annotations

import json
import math
import time
import zlib

from sqlalchemy import func, insert, literal, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from cluster.ledger.latency_bins import LATENCY_COLUMNS, bin_sql, concat_sql, pair_sql
from cluster.ledger.schema import requests as r
from cluster.ledger.schema import rollup, rollup_dirty, rollup_hours, rollup_latency
from cluster.ledger.store import LedgerStore
from cluster.ledger.summary import met_expression
from tenancy import TenancyConfig

HOUR = 3600
GRACE_S = 600.0  # an hour is rolled this long after it ends: most of its late rows are in by then
ROLLUP_LOCK = 0x726F_6C6C  # "roll": with the app's crc32, one job per app at a time (PostgreSQL)


def targets_signature(config: TenancyConfig) -> str:
    """The SLA targets a met count depends on, as text: hours rolled under others are re-rolled."""
    classes = sorted((c.name, c.ttft_target_s, c.tpot_target_s, c.e2e_target_s) for c in config.sla_classes)
    return json.dumps(classes, separators=(",", ":"))


def closed_before(now: float, grace_s: float = GRACE_S) -> int:
    """Hours starting before this have ended at least ``grace_s`` ago."""
    return math.floor((now - grace_s) / HOUR) * HOUR


async def pending_hours(
    store: LedgerStore, app: str, config: TenancyConfig, now: float, limit: int
) -> list[int]:
    """Closed hours to roll: dirty ones (oldest first), then hours rolled under other SLA targets
    whose rows are still kept (newest first)."""
    async with store.connect() as conn:
        dirty = await conn.execute(
            select(rollup_dirty.c.hour)
            .where(rollup_dirty.c.app == app, rollup_dirty.c.hour < closed_before(now))
            .group_by(rollup_dirty.c.hour)
            .order_by(rollup_dirty.c.hour)
            .limit(limit)
        )
        hours = [int(h) for h in dirty.scalars()]
        if len(hours) >= limit:
            return hours
        first = (await conn.execute(select(func.min(r.c.arrival)).where(r.c.app == app))).scalar()
        if first is None:
            return hours
        stale = await conn.execute(
            select(rollup_hours.c.hour)
            .where(
                rollup_hours.c.app == app,
                rollup_hours.c.targets != targets_signature(config),
                rollup_hours.c.hour >= math.floor(first / HOUR) * HOUR,
            )
            .order_by(rollup_hours.c.hour.desc())
            .limit(limit - len(hours))
        )
        return hours + [int(h) for h in stale.scalars() if int(h) not in hours]


async def roll_hour(store: LedgerStore, app: str, hour: int, config: TenancyConfig) -> bool:
    """Rebuild ``app``'s rollup of ``hour`` from its rows; False when another job holds the app."""
    async with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            key = ROLLUP_LOCK ^ zlib.crc32(app.encode())
            if not (await conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key})).scalar():
                return False
        marks = await conn.execute(
            select(rollup_dirty.c.router, rollup_dirty.c.version).where(
                rollup_dirty.c.app == app, rollup_dirty.c.hour == hour
            )
        )
        seen = marks.all()
        for table in (rollup, rollup_latency, rollup_hours):
            await conn.execute(table.delete().where(table.c.app == app, table.c.hour == hour))
        await _roll_sums(conn, app, hour, config)
        await _roll_latency(conn, store.dialect, app, hour)
        await conn.execute(
            insert(rollup_hours).values(
                app=app, hour=hour, targets=targets_signature(config), rolled_at=time.time()
            )
        )
        for router, version in seen:  # a mark raised since stays: its rows may be unseen
            await conn.execute(
                rollup_dirty.delete().where(
                    rollup_dirty.c.app == app,
                    rollup_dirty.c.hour == hour,
                    rollup_dirty.c.router == router,
                    rollup_dirty.c.version == version,
                )
            )
    return True


async def _roll_sums(conn: AsyncConnection, app: str, hour: int, config: TenancyConfig) -> None:
    keys = (r.c.tenant_id, r.c.api_key_id, r.c.model, r.c.sla_class, r.c.outcome)
    query = (
        select(
            literal(app),
            literal(hour),
            *keys,
            func.count(),
            func.sum(r.c.prompt_tokens),
            func.sum(r.c.cached_tokens),
            func.sum(r.c.output_tokens),
            func.sum(met_expression(config)),
            func.sum(r.c.cost_usd),
            func.sum(r.c.replica_seconds),
        )
        .where(r.c.app == app, r.c.arrival >= hour, r.c.arrival < hour + HOUR)
        .group_by(*keys)
    )
    columns = ["app", "hour", "tenant_id", "api_key_id", "model", "sla_class", "outcome", "requests"]
    columns += ["prompt_tokens", "cached_tokens", "output_tokens", "met", "cost_usd", "replica_seconds"]
    await conn.execute(insert(rollup).from_select(columns, query))


async def _roll_latency(conn: AsyncConnection, dialect: str, app: str, hour: int) -> None:
    """One histogram per (tenant, model, class, metric) of the hour's successful rows, built in SQL."""
    hour_ok = "app = :app AND arrival >= :lo AND arrival < :hi AND outcome = 'ok'"
    if dialect == "postgresql":  # one scan: the metrics unpivoted per row
        values = ", ".join(LATENCY_COLUMNS)
        names = ", ".join(f"'{m}'" for m in LATENCY_COLUMNS)
        per_metric = (
            f"SELECT tenant_id, model, sla_class, m.metric, {bin_sql('m.v')} AS b, COUNT(*) AS n "
            f"FROM ledger_requests, unnest(ARRAY[{values}], ARRAY[{names}]) AS m(v, metric) "
            f"WHERE {hour_ok} AND m.v IS NOT NULL GROUP BY tenant_id, model, sla_class, m.metric, b"
        )
    else:
        per_metric = " UNION ALL ".join(
            f"SELECT tenant_id, model, sla_class, '{m}' AS metric, {bin_sql(m)} AS b, COUNT(*) AS n "
            f"FROM ledger_requests WHERE {hour_ok} AND {m} IS NOT NULL "
            "GROUP BY tenant_id, model, sla_class, b"
            for m in LATENCY_COLUMNS
        )
    await conn.execute(
        text(
            "INSERT INTO ledger_rollup_latency "
            "(app, hour, tenant_id, model, sla_class, metric, samples, bins) "
            "SELECT CAST(:app_value AS TEXT), CAST(:hour AS BIGINT), "
            "tenant_id, model, sla_class, metric, SUM(n), "
            f"{concat_sql(dialect, pair_sql(dialect, 'b', 'n'))} "
            f"FROM ({per_metric}) AS per_bin GROUP BY tenant_id, model, sla_class, metric"
        ),
        {"app_value": app, "hour": hour, "app": app, "lo": float(hour), "hi": float(hour + HOUR)},
    )


async def roll_pending(
    store: LedgerStore, app: str, config: TenancyConfig, now: float | None = None, limit: int = 48
) -> int:
    """Roll up to ``limit`` pending hours of ``app``; how many were rolled."""
    hours = await pending_hours(store, app, config, time.time() if now is None else now, limit)
    done = 0
    for hour in hours:
        if not await roll_hour(store, app, hour, config):
            break
        done += 1
    return done


async def delete_rollup_before(store: LedgerStore, cutoff: float) -> int:
    """Retention of the rollup: hours that ended before ``cutoff`` go; how many rollup rows went."""
    last = math.floor(cutoff / HOUR) * HOUR - HOUR  # the last hour wholly before the cutoff
    deleted = 0
    async with store.engine.begin() as conn:
        for table in (rollup, rollup_latency, rollup_hours, rollup_dirty):
            result = await conn.execute(table.delete().where(table.c.hour <= last))
            deleted += int(result.rowcount or 0) if table is rollup else 0
    return deleted
