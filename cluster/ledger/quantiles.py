"""Latency percentiles over the ledger's successful rows, per tenant, per class and per model.

Exact nearest rank (the in-memory report's rule) while the range holds at most ``EXACT_ROWS``
successful rows: PostgreSQL's ``percentile_disc`` (the same rule), every grouping and metric in one
statement over ``GROUPING SETS``; SQLite hands the latencies over and they are ranked here. Past
that, exact ranks sort every value of the range per grouping (44 s for a month of 10 million rows
on the CPU box), so the report merges the hourly rollup's histograms instead
(``histogram_quantiles.py``): within 0.25 % of the exact value. The report says which.
"""

from __future__ import annotations

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from cluster.ledger.schema import requests as r
from cluster.telemetry.sla_report import PERCENTILES, percentile

METRICS = ("ttft_s", "tpot_s", "e2e_s")
GROUPINGS = ("tenant_id", "sla_class", "model")
REPORT_WORK_MEM = "256MB"  # for the sorts of this statement's transaction only
EXACT_ROWS = 1_000_000
Quantiles = dict[str, dict[str, float | None]]  # metric -> {"p50": ...}
Ranked = dict[str, dict[str, Quantiles]]  # grouping -> key -> metric -> percentiles


async def exact_quantiles(conn: AsyncConnection, dialect: str, clauses: list) -> Ranked:
    """Every grouping's exact percentiles over the rows ``clauses`` select."""
    if dialect != "postgresql":
        return await fetched(conn, clauses)
    return await ranked_pg(conn, clauses)


async def ranked_pg(conn: AsyncConnection, clauses: list) -> Ranked:
    """Every grouping's p50/p95/p99 of each metric, in the database, in one statement."""
    await conn.execute(text(f"SET LOCAL work_mem = '{REPORT_WORK_MEM}'"))
    # The groups want rows in tenant order, which the (tenant_id, arrival) index offers: the planner
    # takes it and reads the heap in random order. A scan (or a bitmap scan of a short range) and a
    # sort in memory instead. This transaction only.
    await conn.execute(text("SET LOCAL enable_indexscan = off"))
    fractions = ", ".join(str(p / 100) for p in PERCENTILES)
    aggregates = [
        text(f"percentile_disc(ARRAY[{fractions}]) WITHIN GROUP (ORDER BY {m}) AS {m}") for m in METRICS
    ]
    cols = [r.c[g] for g in GROUPINGS]
    # GROUPING(...) is a bit mask of the columns a row is NOT grouped by: which set it belongs to.
    which = func.grouping(*cols).label("which")
    query = (
        select(*cols, which, *aggregates)
        .where(*clauses, r.c.outcome == "ok")
        .group_by(text("GROUPING SETS ((tenant_id), (sla_class), (model))"))
    )
    masks = {0b011: "tenant_id", 0b101: "sla_class", 0b110: "model"}
    out: Ranked = {g: {} for g in GROUPINGS}
    for row in (await conn.execute(query)).all():
        values = row._mapping
        grouping = masks[values["which"]]
        out[grouping][values[grouping]] = {
            m: {f"p{p}": (values[m][i] if values[m] else None) for i, p in enumerate(PERCENTILES)}
            for m in METRICS
        }
    return out


async def fetched(conn: AsyncConnection, clauses: list) -> Ranked:
    """Every grouping's percentiles, ranked here from the successful rows' latencies."""
    query = select(r.c.tenant_id, r.c.sla_class, r.c.model, *(r.c[m] for m in METRICS)).where(
        *clauses, r.c.outcome == "ok"
    )
    values: dict[str, dict[str, dict[str, list[float]]]] = {g: {} for g in GROUPINGS}
    for row in (await conn.execute(query)).all():
        for gi, grouping in enumerate(GROUPINGS):
            per = values[grouping].setdefault(row[gi], {m: [] for m in METRICS})
            for mi, m in enumerate(METRICS):
                if row[3 + mi] is not None:
                    per[m].append(row[3 + mi])
    return {
        g: {
            key: {m: {f"p{p}": percentile(vs, p) for p in PERCENTILES} for m, vs in metrics.items()}
            for key, metrics in groups.items()
        }
        for g, groups in values.items()
    }
