"""Latency percentiles over the ledger's successful rows, per tenant, per class and per model.

Exact nearest rank (the in-memory report's rule) while the range holds at most ``EXACT_ROWS``
successful rows: PostgreSQL's ``percentile_disc`` (the same rule), or, in SQLite, the values
fetched and ranked here. Past that, exact ranks cost a sort of every value per grouping and metric
(nine sorts of the month's rows), so PostgreSQL counts each metric into log-spaced bins 0.5 % wide
(one parallel scan per metric, counts that add up from (tenant, class, model) to each grouping)
and a percentile is its bin's middle: within 0.25 % of the exact value. The report says which.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from sqlalchemy import case, cast, func, literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Integer

from cluster.ledger.schema import requests as r
from cluster.telemetry.sla_report import PERCENTILES, percentile

METRICS = ("ttft_s", "tpot_s", "e2e_s")
GROUPINGS = ("tenant_id", "sla_class", "model")
EXACT_ROWS = 1_000_000
BINS_PER_E = 200  # bins per factor e: each bin spans 0.5 % of its values
FLOOR_S = 1e-6  # values at or below this share one bin, reported as 0
ZERO_BIN = -(10**6)
Quantiles = dict[str, dict[str, float | None]]  # metric -> {"p50": ...}
Ranked = dict[str, dict[str, Quantiles]]  # grouping -> key -> metric -> percentiles


async def quantiles(conn: AsyncConnection, dialect: str, clauses: list, ok_rows: int) -> tuple[Ranked, str]:
    """Every grouping's percentiles, and the method: "exact" or "histogram"."""
    if dialect != "postgresql":
        return await fetched(conn, clauses), "exact"
    if ok_rows <= EXACT_ROWS:
        return {g: await exact_pg(conn, clauses, g) for g in GROUPINGS}, "exact"
    return await histogram_pg(conn, clauses), "histogram"


async def exact_pg(conn: AsyncConnection, clauses: list, grouping: str) -> dict[str, Quantiles]:
    """Per value of ``grouping``: nearest-rank p50/p95/p99 of each metric, in the database."""
    fractions = ", ".join(str(p / 100) for p in PERCENTILES)
    aggregates = [
        text(f"percentile_disc(ARRAY[{fractions}]) WITHIN GROUP (ORDER BY {m}) AS {m}") for m in METRICS
    ]
    group = r.c[grouping]
    query = select(group, *aggregates).where(*clauses, r.c.outcome == "ok").group_by(group)
    out: dict[str, Quantiles] = {}
    for row in (await conn.execute(query)).all():
        values = row._mapping
        out[row[0]] = {
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


def bin_of(column):
    """A value's log bin (``ZERO_BIN`` at or below ``FLOOR_S``)."""
    log_bin = func.floor(func.ln(column / FLOOR_S) * BINS_PER_E)
    return case((column <= FLOOR_S, literal_column(str(ZERO_BIN))), else_=cast(log_bin, Integer))


def bin_middle(b: int) -> float:
    return 0.0 if b == ZERO_BIN else FLOOR_S * math.exp((b + 0.5) / BINS_PER_E)


async def histogram_pg(conn: AsyncConnection, clauses: list) -> Ranked:
    """Percentiles from per-(tenant, class, model) bin counts, summed into each grouping."""
    counts: dict[str, dict[str, dict[str, Counter[int]]]] = {
        g: defaultdict(lambda: {m: Counter() for m in METRICS}) for g in GROUPINGS
    }
    for m in METRICS:
        b = bin_of(r.c[m]).label("bin")
        query = (
            select(r.c.tenant_id, r.c.sla_class, r.c.model, b, func.count().label("n"))
            .where(*clauses, r.c.outcome == "ok", r.c[m].is_not(None))
            .group_by(r.c.tenant_id, r.c.sla_class, r.c.model, b)
        )
        for row in (await conn.execute(query)).all():
            for gi, grouping in enumerate(GROUPINGS):
                counts[grouping][row[gi]][m][int(row.bin)] += int(row.n)
    return {
        g: {key: {m: ranks(hist) for m, hist in metrics.items()} for key, metrics in groups.items()}
        for g, groups in counts.items()
    }


def ranks(hist: Counter[int]) -> dict[str, float | None]:
    """Nearest-rank percentiles of a histogram: the middle of the bin holding each rank."""
    total = sum(hist.values())
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        if not total:
            out[f"p{p}"] = None
            continue
        rank, seen = max(1, math.ceil(p / 100 * total)), 0
        for b in sorted(hist):
            seen += hist[b]
            if seen >= rank:
                out[f"p{p}"] = bin_middle(b)
                break
    return out
