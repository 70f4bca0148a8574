"""The SLA report from the ledger: the same report as a router's memory gives, over every router's rows.

Counts, tokens, attainment and cost are sums, so the database adds them per (tenant, class, model)
and the tenant, class and model groups are summed here. Percentiles do not add up; they come from
``quantiles.py``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import and_, case, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from cluster.ledger.quantiles import GROUPINGS, METRICS, quantiles
from cluster.ledger.schema import requests as r
from cluster.ledger.store import LedgerStore
from cluster.ledger.time_range import TimeRange
from cluster.telemetry.sla_report import PERCENTILES, GroupReport, SLAReport
from tenancy import TenancyConfig

REPORT_WORK_MEM = "256MB"  # for this report's transaction only


@dataclass(slots=True)
class Sums:
    """Additive figures of one group."""

    requests: int = 0
    ok: int = 0
    rejected: int = 0
    tokens: int = 0
    output_tokens: int = 0
    met: int = 0
    cost: float = 0.0
    replica_seconds: float = 0.0
    classes: dict[str, int] = field(default_factory=dict)

    def add(self, row, sla_class: str) -> None:
        # int()/float(): PostgreSQL's sums of BIGINT come back as Decimal.
        self.requests += int(row.requests)
        self.ok += int(row.ok or 0)
        self.rejected += int(row.rejected or 0)
        self.tokens += int(row.tokens or 0)
        self.output_tokens += int(row.output_tokens or 0)
        self.met += int(row.met or 0)
        self.cost += float(row.cost or 0.0)
        self.replica_seconds += float(row.replica_seconds or 0.0)
        self.classes[sla_class] = self.classes.get(sla_class, 0) + int(row.requests)


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


async def group_sums(conn: AsyncConnection, clauses: list, config: TenancyConfig) -> list:
    ok = r.c.outcome == "ok"
    query = (
        select(
            r.c.tenant_id,
            r.c.sla_class,
            r.c.model,
            func.count().label("requests"),
            func.sum(case((ok, 1), else_=0)).label("ok"),
            func.sum(case((r.c.outcome == "rejected", 1), else_=0)).label("rejected"),
            func.sum(case((ok, r.c.prompt_tokens + r.c.output_tokens), else_=0)).label("tokens"),
            func.sum(case((ok, r.c.output_tokens), else_=0)).label("output_tokens"),
            func.sum(case((ok, met_expression(config)), else_=0)).label("met"),
            func.sum(r.c.cost_usd).label("cost"),
            func.sum(r.c.replica_seconds).label("replica_seconds"),
        )
        .where(*clauses)
        .group_by(r.c.tenant_id, r.c.sla_class, r.c.model)
    )
    return list((await conn.execute(query)).all())


async def ledger_sla(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    app: str | None = None,
    tenant_id: str | None = None,
) -> tuple[SLAReport, str]:
    """The SLA report over the ledger's rows in ``rng`` (of one app, of one tenant when given: then,
    as in a router's own report, no model groups), and how its percentiles were ranked."""
    clauses = where(rng, app, tenant_id)
    async with store.connect() as conn:
        if store.dialect == "postgresql":  # the percentiles sort in memory, not in files
            await conn.execute(text(f"SET LOCAL work_mem = '{REPORT_WORK_MEM}'"))
        sums = await group_sums(conn, clauses, config)
        ok_rows = sum(int(row.ok or 0) for row in sums)
        ranked, method = await quantiles(conn, store.dialect, clauses, ok_rows)
    groups: dict[str, dict[str, Sums]] = {g: defaultdict(Sums) for g in GROUPINGS}
    for row in sums:
        for grouping in GROUPINGS:
            groups[grouping][getattr(row, grouping)].add(row, row.sla_class)
    window = max(rng.seconds, 1e-9)
    classes_of = config.tenants_by_id

    def report(grouping: str, key: str, tenant: str, sla_class: str, model: str = "*") -> GroupReport:
        s = groups[grouping][key]
        q = ranked[grouping].get(key, {m: {f"p{p}": None for p in PERCENTILES} for m in METRICS})
        served = s.requests - s.rejected
        return GroupReport(
            tenant_id=tenant,
            sla_class=sla_class,
            requests=s.requests,
            ok=s.ok,
            rejected=s.rejected,
            failed=served - s.ok,
            output_tokens=s.output_tokens,
            ttft_s=q["ttft_s"],
            tpot_s=q["tpot_s"],
            e2e_s=q["e2e_s"],
            sla_attainment=s.met / served if served else None,
            goodput_rps=s.met / window,
            dollars_per_success=s.cost / s.ok if s.ok else None,
            model=model,
        )

    def class_of(tid: str) -> str:
        if tid in classes_of:
            return classes_of[tid].sla_class
        return max(groups["tenant_id"][tid].classes.items(), key=lambda kv: kv[1])[0]

    tenants = [report("tenant_id", t, t, class_of(t)) for t in sorted(groups["tenant_id"])]
    classes = [report("sla_class", c, "*", c) for c in sorted(groups["sla_class"])]
    models = (
        [] if tenant_id is not None else [report("model", m, "*", "*", m) for m in sorted(groups["model"])]
    )
    seconds = {} if tenant_id is not None else {m: s.replica_seconds for m, s in groups["model"].items()}
    total_seconds = sum(s.replica_seconds for s in groups["model"].values())
    total_cost = sum(s.cost for s in groups["model"].values())
    report = SLAReport(rng.seconds, total_seconds, total_cost, tenants, classes, models, seconds)
    return report, method
