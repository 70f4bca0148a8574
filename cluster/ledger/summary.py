"""The additive half of every ledger report, in one scan: sums per (bucket, tenant, API key, model,
class, outcome). The SLA report folds them into its tenant, class and model groups, usage into its
buckets; a month of rows comes back as a few thousand sums."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, Integer, and_, case, cast, func, literal, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from cluster.ledger.schema import requests as r
from cluster.ledger.time_range import TimeRange
from tenancy import TenancyConfig


@dataclass(frozen=True, slots=True)
class SumRow:
    """One (bucket, tenant, key, model, class, outcome)'s sums; tokens as the reports count them."""

    start: int
    tenant_id: str
    api_key_id: str
    model: str
    sla_class: str
    outcome: str
    requests: int
    input_tokens: int  # prompts of requests not refused
    cached_tokens: int
    output_tokens: int
    met: int  # successful requests within every target of their class
    cost: float
    replica_seconds: float


def where(rng: TimeRange, app: str | None, tenant_id: str | None) -> list:
    clauses = [r.c.arrival >= rng.start, r.c.arrival < rng.end]
    if app is not None:
        clauses.append(r.c.app == app)
    if tenant_id is not None:
        clauses.append(r.c.tenant_id == tenant_id)
    return clauses


def met_expression(config: TenancyConfig):
    """1 for a successful row within every target of its own class (``meets_sla``), else 0."""
    whens = [
        (
            and_(
                r.c.outcome == "ok",
                r.c.sla_class == c.name,
                r.c.ttft_s <= c.ttft_target_s,
                r.c.e2e_s <= c.e2e_target_s,
                or_(r.c.tpot_s.is_(None), r.c.tpot_s <= c.tpot_target_s),
            ),
            1,
        )
        for c in config.sla_classes
    ]
    return case(*whens, else_=0)


def bucket_start(dialect: str, width: int | None):
    """The start of a row's bucket in unix seconds (arrivals are positive: truncation is floor)."""
    if width is None:
        return literal(0)
    if dialect == "postgresql":
        return cast(func.floor(r.c.arrival / width), BigInteger) * width  # past 2038 too
    return (cast(r.c.arrival, Integer) // width) * width  # SQLite: integer division


async def summary(
    conn: AsyncConnection, dialect: str, clauses: list, config: TenancyConfig, width: int | None = None
) -> list[SumRow]:
    """The sums of the rows ``clauses`` select, per ``width``-second bucket (None: one bucket)."""
    if dialect == "postgresql":
        # The planner has no statistics for the bucket expression, guesses a group per row and
        # sorts a month of rows to disk (13.6 s for 10 million); the groups are a few thousand, so
        # a hash table it is (3.5 s). For this statement's transaction only.
        await conn.execute(text("SET LOCAL enable_sort = off"))
    start = bucket_start(dialect, width).label("start")
    served = r.c.outcome != "rejected"
    keys = (start, r.c.tenant_id, r.c.api_key_id, r.c.model, r.c.sla_class, r.c.outcome)
    query = (
        select(
            *keys,
            func.count().label("requests"),
            func.sum(case((served, r.c.prompt_tokens), else_=0)).label("input_tokens"),
            func.sum(case((served, r.c.cached_tokens), else_=0)).label("cached_tokens"),
            func.sum(r.c.output_tokens).label("output_tokens"),
            func.sum(met_expression(config)).label("met"),
            func.sum(r.c.cost_usd).label("cost"),
            func.sum(r.c.replica_seconds).label("replica_seconds"),
        )
        .where(*clauses)
        .group_by(*keys)
    )
    return [sum_row(row) for row in (await conn.execute(query)).all()]


def sum_row(row) -> SumRow:
    """A result row as a SumRow; int()/float(): PostgreSQL's sums of BIGINT come back as Decimal."""
    return SumRow(
        int(row.start),
        row.tenant_id,
        row.api_key_id,
        row.model,
        row.sla_class,
        row.outcome,
        int(row.requests),
        int(row.input_tokens or 0),
        int(row.cached_tokens or 0),
        int(row.output_tokens or 0),
        int(row.met or 0),
        float(row.cost or 0.0),
        float(row.replica_seconds or 0.0),
    )
