"""The SLA report from the ledger: the same report as a router's memory gives, over every router's rows.

The sums (the hourly rollup's for whole hours, ``rollup_query.py``, and the rows' for the rest,
``summary.py``), folded here into the tenant, class and model groups (and into usage buckets when
asked), then the percentiles, which do not add up and are ranked per group: exactly from the rows
(``quantiles.py``) up to ``EXACT_ROWS`` successful rows, else from merged histograms
(``histogram_quantiles.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from cluster.ledger import quantiles
from cluster.ledger.histogram_quantiles import histogram_ranked
from cluster.ledger.quantiles import GROUPINGS, METRICS, Ranked, exact_quantiles
from cluster.ledger.rollup_job import targets_signature
from cluster.ledger.rollup_plan import Plan, all_rows, plan
from cluster.ledger.rollup_query import plan_sums
from cluster.ledger.store import LedgerStore
from cluster.ledger.summary import SumRow, where
from cluster.ledger.time_range import TimeRange
from cluster.telemetry.sla_report import PERCENTILES, GroupReport, SLAReport
from tenancy import TenancyConfig

NO_QUANTILES = {m: {f"p{p}": None for p in PERCENTILES} for m in METRICS}


@dataclass(slots=True)
class Sums:
    """Additive figures of one group."""

    requests: int = 0
    ok: int = 0
    rejected: int = 0
    output_tokens: int = 0
    met: int = 0
    cost: float = 0.0
    replica_seconds: float = 0.0
    classes: dict[str, int] = field(default_factory=dict)

    def add(self, row: SumRow) -> None:
        self.requests += row.requests
        self.ok += row.requests if row.outcome == "ok" else 0
        self.rejected += row.requests if row.outcome == "rejected" else 0
        self.output_tokens += row.output_tokens if row.outcome == "ok" else 0
        self.met += row.met
        self.cost += row.cost
        self.replica_seconds += row.replica_seconds
        self.classes[row.sla_class] = self.classes.get(row.sla_class, 0) + row.requests


@dataclass(frozen=True, slots=True)
class LedgerReport:
    sla: SLAReport
    percentiles: str  # "exact" or "histogram"
    sums: list[SumRow]  # per bucket when a width was asked for (usage_query folds them)


async def report_plan(
    store: LedgerStore, config: TenancyConfig, rng: TimeRange, app: str | None, tenant_id: str | None
) -> Plan:
    """Which hours the rollup answers and which the rows do (``rollup_plan.py``)."""
    async with store.connect() as conn:
        return await plan(conn, rng, app, tenant_id, targets_signature(config))


async def _ranked(
    store: LedgerStore, rng: TimeRange, app, tenant_id, plan_: Plan, ok_rows: int
) -> tuple[Ranked, str]:
    if ok_rows <= quantiles.EXACT_ROWS:
        async with store.connect() as conn:
            return await exact_quantiles(conn, store.dialect, where(rng, app, tenant_id)), "exact"
    return await histogram_ranked(store, plan_), "histogram"


async def ledger_report(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    app: str | None = None,
    tenant_id: str | None = None,
    width: int | None = None,
    use_rollup: bool = True,
) -> LedgerReport:
    """The SLA report over the ledger's rows in ``rng`` (of one app; of one tenant when given: then,
    as in a router's own report, no model groups), with the sums per ``width``-second bucket. Whole
    hours come from the hourly rollup where it is up to date (unless ``use_rollup`` is False), the
    rest from the rows."""
    plan_ = (
        await report_plan(store, config, rng, app, tenant_id) if use_rollup else all_rows(rng, app, tenant_id)
    )
    sums = await plan_sums(store, plan_, config, width)
    ok_rows = sum(s.requests for s in sums if s.outcome == "ok")
    ranked, method = await _ranked(store, rng, app, tenant_id, plan_, ok_rows)
    groups: dict[str, dict[str, Sums]] = {g: defaultdict(Sums) for g in GROUPINGS}
    for row in sums:
        for grouping in GROUPINGS:
            groups[grouping][getattr(row, grouping)].add(row)
    window = max(rng.seconds, 1e-9)
    classes_of = config.tenants_by_id

    def report(grouping: str, key: str, tenant: str, sla_class: str, model: str = "*") -> GroupReport:
        s = groups[grouping][key]
        q = ranked[grouping].get(key, NO_QUANTILES)
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
    per_model = tenant_id is None
    models = [report("model", m, "*", "*", m) for m in sorted(groups["model"])] if per_model else []
    seconds = {m: s.replica_seconds for m, s in groups["model"].items()} if per_model else {}
    total_seconds = sum(s.replica_seconds for s in groups["model"].values())
    total_cost = sum(s.cost for s in groups["model"].values())
    sla = SLAReport(rng.seconds, total_seconds, total_cost, tenants, classes, models, seconds)
    return LedgerReport(sla, method, sums)


async def ledger_sla(
    store: LedgerStore,
    config: TenancyConfig,
    rng: TimeRange,
    app: str | None = None,
    tenant_id: str | None = None,
) -> tuple[SLAReport, str]:
    """The SLA report alone, and how its percentiles were ranked."""
    both = await ledger_report(store, config, rng, app, tenant_id)
    return both.sla, both.percentiles
