"""Which part of a report's range comes from the hourly rollup and which from the rows.

The rollup answers the range's whole hours, except stale ones: hours with rows stored since they
were rolled up (dirty: the current hour, late rows), and hours rolled under other SLA targets while
their rows are still kept. The rows answer the rest: the partial hours at the range's edges and
the stale hours. An hour neither dirty nor rolled up has no rows (the writer marks every hour it
stores into), so the rollup's silence about it is right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import and_, func, not_, or_, select, union
from sqlalchemy.ext.asyncio import AsyncConnection

from cluster.ledger.rollup_job import HOUR
from cluster.ledger.schema import requests as r
from cluster.ledger.schema import rollup_dirty, rollup_hours
from cluster.ledger.time_range import TimeRange

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Plan:
    """Row intervals (edges for every app, stale hours per app) and the rollup's hours."""

    rng: TimeRange
    app: str | None
    tenant_id: str | None
    whole: tuple[int, int] | None  # [first, end) of the whole hours; None: the range has none
    edges: list[Interval]
    stale: dict[str, list[int]]  # app -> hours read from rows instead of the rollup

    def _filters(self, table) -> list:
        out = []
        if self.app is not None:
            out.append(table.c.app == self.app)
        if self.tenant_id is not None:
            out.append(table.c.tenant_id == self.tenant_id)
        return out

    def raw_clauses(self) -> list | None:
        """Where clauses on ``ledger_requests`` for the rows to read; None: none."""
        parts = [_within(r.c.arrival, lo, hi) for lo, hi in self.edges]
        for app, hours in self.stale.items():
            spans = merged([(h, h + HOUR) for h in hours])
            parts.append(and_(r.c.app == app, or_(*(_within(r.c.arrival, lo, hi) for lo, hi in spans))))
        if not parts:
            return None
        return [*self._filters(r), or_(*parts)]

    def rollup_clauses(self, table) -> list | None:
        """Where clauses on a rollup table for the hours it answers; None: none."""
        if self.whole is None:
            return None
        first, end = self.whole
        clauses = [*self._filters(table), table.c.hour >= first, table.c.hour < end]
        for app, hours in self.stale.items():
            clauses.append(not_(and_(table.c.app == app, table.c.hour.in_(hours))))
        return clauses

    @property
    def rollup_hours(self) -> int:
        if self.whole is None:
            return 0
        return (self.whole[1] - self.whole[0]) // HOUR - len({h for hs in self.stale.values() for h in hs})


def _within(column, lo: float, hi: float):
    return and_(column >= lo, column < hi)


def merged(intervals: list[Interval]) -> list[Interval]:
    """Touching or overlapping intervals as one, in order; empty ones dropped."""
    out: list[Interval] = []
    for lo, hi in sorted(i for i in intervals if i[1] > i[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def all_rows(rng: TimeRange, app: str | None, tenant_id: str | None) -> Plan:
    """Every row of the range from ``ledger_requests`` (the rollup unused)."""
    return Plan(rng, app, tenant_id, None, [(rng.start, rng.end)], {})


async def plan(
    conn: AsyncConnection, rng: TimeRange, app: str | None, tenant_id: str | None, targets: str
) -> Plan:
    """The plan of ``rng`` (of one app, or every app), ``targets`` being the report's SLA targets
    (``rollup_job.targets_signature``)."""
    first = math.ceil(rng.start / HOUR) * HOUR
    end = math.floor(rng.end / HOUR) * HOUR
    if end <= first:
        return all_rows(rng, app, tenant_id)
    in_range = [rollup_dirty.c.hour >= first, rollup_dirty.c.hour < end]
    if app is not None:
        in_range.append(rollup_dirty.c.app == app)
    dirty = select(rollup_dirty.c.app, rollup_dirty.c.hour).where(*in_range)
    rolled = [rollup_hours.c.hour >= first, rollup_hours.c.hour < end, rollup_hours.c.targets != targets]
    if app is not None:
        rolled.append(rollup_hours.c.app == app)
    # Rolled under other targets but its rows are gone (retention): the rollup is all there is.
    rolled.append(rollup_hours.c.hour >= _first_row_hour(rollup_hours.c.app))
    mismatched = select(rollup_hours.c.app, rollup_hours.c.hour).where(*rolled)
    stale: dict[str, set[int]] = {}
    for row_app, hour in (await conn.execute(union(dirty, mismatched))).all():
        stale.setdefault(row_app, set()).add(int(hour))
    edges = merged([(rng.start, float(first)), (float(end), rng.end)])
    return Plan(rng, app, tenant_id, (first, end), edges, {a: sorted(h) for a, h in stale.items()})


def _first_row_hour(app_column):
    """The hour of the app's oldest stored row (a correlated subquery on the (app, arrival) index)."""
    oldest = select(func.min(r.c.arrival)).where(r.c.app == app_column).scalar_subquery()
    return func.floor(oldest / HOUR) * HOUR
