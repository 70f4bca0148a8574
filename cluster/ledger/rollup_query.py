"""Reports' sums over a plan (``rollup_plan.py``): the rollup's whole hours plus the rows' edges.

Both halves come back as the same SumRows per (bucket, tenant, key, model, class, outcome); the
reports fold them by key, so a key found in both simply adds up. Counts and tokens are exact; the
cost and replica-seconds are sums of hourly sums, equal to the rows' sum up to float rounding.
"""

from __future__ import annotations

from sqlalchemy import case, func, literal, select

from cluster.ledger.rollup_plan import Plan
from cluster.ledger.schema import rollup as ru
from cluster.ledger.store import LedgerStore
from cluster.ledger.summary import SumRow, sum_row, summary
from tenancy import TenancyConfig


def rollup_summary_query(clauses: list, width: int | None):
    """The rollup's sums per ``width``-second bucket (hours start on whole hours, so they nest)."""
    start = literal(0) if width is None else (ru.c.hour // width) * width
    served = ru.c.outcome != "rejected"
    keys = (start.label("start"), ru.c.tenant_id, ru.c.api_key_id, ru.c.model, ru.c.sla_class, ru.c.outcome)
    return (
        select(
            *keys,
            func.sum(ru.c.requests).label("requests"),
            func.sum(case((served, ru.c.prompt_tokens), else_=0)).label("input_tokens"),
            func.sum(case((served, ru.c.cached_tokens), else_=0)).label("cached_tokens"),
            func.sum(ru.c.output_tokens).label("output_tokens"),
            func.sum(ru.c.met).label("met"),
            func.sum(ru.c.cost_usd).label("cost"),
            func.sum(ru.c.replica_seconds).label("replica_seconds"),
        )
        .where(*clauses)
        .group_by(*keys)
    )


async def plan_sums(store: LedgerStore, plan: Plan, config: TenancyConfig, width: int | None) -> list[SumRow]:
    """The sums of the plan's range: the rollup's hours, then the rows of the rest."""
    out: list[SumRow] = []
    rolled = plan.rollup_clauses(ru)
    if rolled is not None:
        async with store.connect() as conn:
            out += [sum_row(row) for row in (await conn.execute(rollup_summary_query(rolled, width))).all()]
    raw = plan.raw_clauses()
    if raw is not None:
        async with store.connect() as conn:
            out += await summary(conn, store.dialect, raw, config, width)
    return out
