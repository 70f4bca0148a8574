"""Percentiles of a range too large to rank exactly: the rollup's hourly histograms of its whole
hours merged with the rows of its edges binned alike (``latency_bins.py``: within 0.25 %).

Per (tenant, class, model, metric) the stored histograms of every hour are concatenated and
decoded at once; each grouping (tenant, class, model) adds the bins of its keys and ranks them.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from sqlalchemy import func, literal, literal_column, select, union_all

from cluster.ledger.latency_bins import bin_sql, decoded, dense, ranks
from cluster.ledger.quantiles import GROUPINGS, METRICS, Ranked
from cluster.ledger.rollup_plan import Plan
from cluster.ledger.schema import requests as r
from cluster.ledger.schema import rollup_latency as rl
from cluster.ledger.store import LedgerStore
from cluster.telemetry.sla_report import PERCENTILES

Key = tuple[str, str, str, str]  # tenant, class, model, metric
Parts = dict[Key, list[tuple[np.ndarray, np.ndarray]]]


async def _rolled(store: LedgerStore, plan: Plan, parts: Parts) -> None:
    clauses = plan.rollup_clauses(rl)
    if clauses is None:
        return
    keys = (rl.c.tenant_id, rl.c.sla_class, rl.c.model, rl.c.metric)
    # The database concatenates each key's hours: a month comes back as one text per key.
    joined = (
        func.string_agg(rl.c.bins, "") if store.dialect == "postgresql" else func.group_concat(rl.c.bins, "")
    )
    query = select(*keys, joined).where(*clauses, rl.c.metric.in_(METRICS)).group_by(*keys)
    async with store.connect() as conn:
        for tenant, sla_class, model, metric, bins in (await conn.execute(query)).all():
            parts[(tenant, sla_class, model, metric)].append(decoded(bins or ""))


async def _raw(store: LedgerStore, plan: Plan, parts: Parts) -> None:
    clauses = plan.raw_clauses()
    if clauses is None:
        return
    selects = []
    for metric in METRICS:
        b = literal_column(bin_sql(metric))
        keys = (r.c.tenant_id, r.c.sla_class, r.c.model)
        selects.append(
            select(*keys, literal(metric).label("metric"), b.label("b"), func.count().label("n"))
            .where(*clauses, r.c.outcome == "ok", r.c[metric].is_not(None))
            .group_by(*keys, b)
        )
    found: dict[Key, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    async with store.connect() as conn:
        for tenant, sla_class, model, metric, b, n in (await conn.execute(union_all(*selects))).all():
            bins, counts = found[(tenant, sla_class, model, metric)]
            bins.append(int(b))
            counts.append(int(n))
    for key, (bins, counts) in found.items():
        parts[key].append((np.array(bins, dtype=np.int64), np.array(counts, dtype=np.int64)))


async def histogram_ranked(store: LedgerStore, plan: Plan) -> Ranked:
    """Every grouping's percentiles over the plan's range, from merged histograms."""
    parts: Parts = defaultdict(list)
    await _rolled(store, plan, parts)
    await _raw(store, plan, parts)
    grouped: dict[str, dict[str, dict[str, list]]] = {
        g: defaultdict(lambda: {m: [] for m in METRICS}) for g in GROUPINGS
    }
    for (tenant, sla_class, model, metric), pieces in parts.items():
        for grouping, value in zip(GROUPINGS, (tenant, sla_class, model), strict=True):
            grouped[grouping][value][metric].extend(pieces)
    return {
        g: {
            key: {m: ranks(dense(pieces), PERCENTILES) for m, pieces in metrics.items()}
            for key, metrics in groups.items()
        }
        for g, groups in grouped.items()
    }
