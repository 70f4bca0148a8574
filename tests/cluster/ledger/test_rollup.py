"""The hourly rollup: reports that read it agree with the rows (counts, tokens and cost exactly,
percentiles within the bins' bound), nothing is counted twice, late rows are never lost."""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

import pytest
from sqlalchemy import func, select, text

from cluster.ledger import quantiles, rollup_job
from cluster.ledger.latency_bins import ERROR_BOUND, bin_of, bin_sql, decoded, dense, middle, pair_sql
from cluster.ledger.rollup_job import HOUR, delete_rollup_before, roll_pending
from cluster.ledger.rollup_plan import plan
from cluster.ledger.rows import LedgerRow
from cluster.ledger.schema import rollup, rollup_dirty
from cluster.ledger.sla_query import ledger_report
from cluster.ledger.store import LedgerStore
from cluster.ledger.time_range import TimeRange
from cluster.ledger.usage_query import usage_results
from tenancy import default_tenancy_config
from tests.cluster.ledger.rows_factory import rows

CONFIG = default_tenancy_config()
GROUP_FIGURES = ("tenant_id", "sla_class", "model", "requests", "ok", "rejected", "failed", "output_tokens")
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
NOW = math.floor(time.time() / HOUR) * HOUR  # hours before this one are closed once past the grace


def spread(batch: list[LedgerRow], first_hour: int, hours: int, seed: int = 3) -> list[LedgerRow]:
    """The rows moved to random instants of ``hours`` hours from ``first_hour``."""
    rng = random.Random(seed)
    out = []
    for row in batch:
        arrival = first_hour + rng.uniform(0, hours * HOUR)
        out.append(replace(row, arrival=arrival, ended=arrival + (row.ended - row.arrival)))
    return out


async def _rolled_store(dsn: str, batch: list[LedgerRow]) -> LedgerStore:
    store = LedgerStore(dsn)
    await store.migrate()
    await store.insert(batch)
    while await roll_pending(store, "app", CONFIG):
        pass
    return store


def _assert_same_report(rolled, raw, exact_percentiles=None) -> None:
    """Counts, tokens, met counts and cost alike; percentiles equal or within the bound."""
    groups = zip(
        rolled.sla.tenants + rolled.sla.classes + rolled.sla.models,
        raw.sla.tenants + raw.sla.classes + raw.sla.models,
        strict=True,
    )
    for a, b in groups:
        assert {k: getattr(a, k) for k in GROUP_FIGURES} == {k: getattr(b, k) for k in GROUP_FIGURES}
        assert a.sla_attainment == b.sla_attainment and a.goodput_rps == b.goodput_rps
        assert a.dollars_per_success == pytest.approx(b.dollars_per_success, rel=1e-12)
        for metric in LATENCIES:
            assert getattr(a, metric) == getattr(b, metric), (a.tenant_id, a.sla_class, a.model, metric)
    assert rolled.sla.gpu_dollars == pytest.approx(raw.sla.gpu_dollars, rel=1e-12)
    assert rolled.sla.replica_seconds == pytest.approx(raw.sla.replica_seconds, rel=1e-12)
    for width in (HOUR, 86400):
        mine, theirs = usage_results(rolled.sums, width), usage_results(raw.sums, width)
        assert mine[1] == theirs[1]
        exact = ("start_time", "tenant_id", "api_key_id", "model", "num_model_requests", "num_rejected")
        exact += ("input_tokens", "input_cached_tokens", "output_tokens")
        assert [[getattr(r, k) for k in exact] for r in mine[0]] == [
            [getattr(r, k) for k in exact] for r in theirs[0]
        ]
        assert [r.cost_usd for r in mine[0]] == pytest.approx([r.cost_usd for r in theirs[0]], rel=1e-12)


async def test_a_report_from_the_rollup_agrees_with_the_rows(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = spread(rows(1500, seed=21), NOW - 12 * HOUR, 10)
    store = await _rolled_store(dsn, batch)
    try:
        rng = TimeRange(NOW - 11.5 * HOUR, NOW - 3.25 * HOUR)  # partial hours at both edges
        async with store.connect() as conn:
            p = await plan(conn, rng, "app", None, rollup_job.targets_signature(CONFIG))
        assert p.whole == (NOW - 11 * HOUR, NOW - 4 * HOUR) and p.stale == {} and p.rollup_hours == 7
        # Exact percentiles below EXACT_ROWS: the sums come from the rollup, the ranks from the rows.
        rolled = await ledger_report(store, CONFIG, rng, app="app", width=HOUR)
        raw = await ledger_report(store, CONFIG, rng, app="app", width=HOUR, use_rollup=False)
        assert rolled.percentiles == raw.percentiles == "exact"
        _assert_same_report(rolled, raw)
        assert sum(t.requests for t in rolled.sla.tenants) == sum(
            rng.start <= r.arrival < rng.end for r in batch
        )
        # Past EXACT_ROWS: the rollup's histograms plus the edges binned alike are the rows' histograms.
        monkeypatch.setattr(quantiles, "EXACT_ROWS", 0)
        binned = await ledger_report(store, CONFIG, rng, app="app", width=86400)
        binned_raw = await ledger_report(store, CONFIG, rng, app="app", width=86400, use_rollup=False)
        assert binned.percentiles == binned_raw.percentiles == "histogram"
        _assert_same_report(binned, binned_raw)
        # ... and within the bound of the exact ranks.
        for a, b in zip(
            binned.sla.tenants + binned.sla.classes, raw.sla.tenants + raw.sla.classes, strict=True
        ):
            for metric in LATENCIES:
                for p_name, exact in getattr(b, metric).items():
                    assert getattr(a, metric)[p_name] == pytest.approx(exact, rel=ERROR_BOUND + 1e-9)
        mine = await ledger_report(store, CONFIG, rng, app="app", tenant_id="alice")
        assert [t.tenant_id for t in mine.sla.tenants] == ["alice"]
        assert mine.sla.tenants[0].requests == sum(
            rng.start <= r.arrival < rng.end and r.tenant_id == "alice" for r in batch
        )
    finally:
        await store.close()


async def test_whole_hours_are_read_from_the_rollup(dsn: str) -> None:
    """Rows deleted behind the rollup's back still count: the report did not read them."""
    batch = spread(rows(400, seed=4), NOW - 6 * HOUR, 4)
    store = await _rolled_store(dsn, batch)
    try:
        async with store.engine.begin() as conn:
            await conn.execute(text("DELETE FROM ledger_requests"))
        report = await ledger_report(store, CONFIG, TimeRange(NOW - 6 * HOUR, NOW - 2 * HOUR), app="app")
        assert sum(t.requests for t in report.sla.tenants) == 400
    finally:
        await store.close()


async def _rollup_requests(store: LedgerStore) -> int:
    async with store.connect() as conn:
        return int((await conn.execute(select(func.sum(rollup.c.requests)))).scalar() or 0)


async def _dirty_hours(store: LedgerStore) -> set[int]:
    async with store.connect() as conn:
        return {int(h) for h in (await conn.execute(select(rollup_dirty.c.hour))).scalars()}


async def test_a_replay_is_not_counted_twice(dsn: str) -> None:
    batch = spread(rows(300, seed=5), NOW - 5 * HOUR, 3)
    store = await _rolled_store(dsn, batch)
    try:
        assert await _rollup_requests(store) == 300 and await _dirty_hours(store) == set()
        await store.insert(batch[:200])  # the spill file replayed after a lost answer
        if store.dialect == "postgresql":
            assert await _dirty_hours(store) == set()  # no row went in: no hour marked
        while await roll_pending(store, "app", CONFIG):
            pass
        assert await _rollup_requests(store) == 300
    finally:
        await store.close()


async def test_a_late_row_marks_its_hour_and_counts_before_and_after_the_next_roll(dsn: str) -> None:
    batch = spread(rows(200, seed=6), NOW - 5 * HOUR, 3)
    store = await _rolled_store(dsn, batch)
    try:
        late = replace(rows(1, seed=99)[0], arrival=NOW - 4 * HOUR + 10.0, ended=NOW - 4 * HOUR + 11.0)
        await store.insert([late])
        assert await _dirty_hours(store) == {NOW - 4 * HOUR}
        rng = TimeRange(NOW - 5 * HOUR, NOW - 2 * HOUR)
        before = await ledger_report(store, CONFIG, rng, app="app")
        assert sum(t.requests for t in before.sla.tenants) == 201  # the dirty hour read from rows
        assert await roll_pending(store, "app", CONFIG) == 1
        after = await ledger_report(store, CONFIG, rng, app="app")
        assert sum(t.requests for t in after.sla.tenants) == 201 and await _rollup_requests(store) == 201
    finally:
        await store.close()


async def test_a_row_stored_while_its_hour_is_rolled_is_not_lost(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stores into the hour between the rebuild's read and its commit: the mark survives."""
    hour = NOW - 4 * HOUR
    batch = spread(rows(100, seed=7), hour, 1)
    store = LedgerStore(pg_dsn)
    writer = LedgerStore(pg_dsn)
    try:
        await store.migrate()
        await store.insert(batch)
        late = replace(rows(1, seed=98)[0], arrival=hour + 5.0, ended=hour + 6.0)
        roll_latency = rollup_job._roll_latency

        async def racing(conn, dialect, app, h):
            await roll_latency(conn, dialect, app, h)
            await writer.insert([late])  # commits on its own connection: unseen by this rebuild

        monkeypatch.setattr(rollup_job, "_roll_latency", racing)
        assert await roll_pending(store, "app", CONFIG) == 1
        monkeypatch.setattr(rollup_job, "_roll_latency", roll_latency)
        assert await _rollup_requests(store) == 100 and await _dirty_hours(store) == {hour}
        rng = TimeRange(hour, hour + HOUR)
        assert (
            sum(t.requests for t in (await ledger_report(store, CONFIG, rng, app="app")).sla.tenants) == 101
        )
        assert await roll_pending(store, "app", CONFIG) == 1
        assert await _rollup_requests(store) == 101 and await _dirty_hours(store) == set()
    finally:
        await store.close()
        await writer.close()


async def test_other_sla_targets_read_the_rows_until_the_hours_are_rolled_again(dsn: str) -> None:
    batch = spread(rows(400, seed=8), NOW - 5 * HOUR, 3)
    store = await _rolled_store(dsn, batch)
    try:
        strict = CONFIG.model_copy(
            update={"sla_classes": [c.model_copy(update={"e2e_target_s": 1.0}) for c in CONFIG.sla_classes]}
        )
        rng = TimeRange(NOW - 5 * HOUR, NOW - 2 * HOUR)
        raw = await ledger_report(store, strict, rng, app="app", use_rollup=False)
        _assert_same_report(await ledger_report(store, strict, rng, app="app"), raw)
        assert (
            raw.sla.tenants[0].sla_attainment
            != (await ledger_report(store, CONFIG, rng, app="app")).sla.tenants[0].sla_attainment
        )
        assert await roll_pending(store, "app", strict) == 3  # re-rolled under the new targets
        async with store.connect() as conn:
            p = await plan(conn, rng, "app", None, rollup_job.targets_signature(strict))
        assert p.stale == {}
        _assert_same_report(await ledger_report(store, strict, rng, app="app"), raw)
    finally:
        await store.close()


async def test_rollup_retention_deletes_whole_hours_before_the_cutoff(dsn: str) -> None:
    batch = spread(rows(300, seed=9), NOW - 6 * HOUR, 4)
    store = await _rolled_store(dsn, batch)
    try:
        async with store.connect() as conn:
            older = select(func.count()).select_from(rollup).where(rollup.c.hour < NOW - 4 * HOUR)
            old = int((await conn.execute(older)).scalar() or 0)
        assert old > 0
        # The cutoff half-way through an hour: that hour stays whole, the ones before it go.
        assert await delete_rollup_before(store, NOW - 4 * HOUR + 1800) == old
        assert await _rollup_requests(store) == sum(r.arrival >= NOW - 4 * HOUR for r in batch)
    finally:
        await store.close()


async def test_bins_are_the_same_in_sql_and_python_and_large_counts_survive(dsn: str) -> None:
    store = LedgerStore(dsn)
    try:
        values = [0.0, 1e-7, 2e-6, 0.001, 0.0123, 0.5, 1.0, 3.7, 61.0, 7200.0, 5e9]
        async with store.connect() as conn:
            for v in values:
                b = (await conn.execute(text(f"SELECT {bin_sql(':v')}"), {"v": v})).scalar()
                assert b == bin_of(v), v
                if 1e-6 < v < 1e9:  # the bin's middle stands for it within the bound
                    assert middle(b) == pytest.approx(v, rel=ERROR_BOUND + 1e-12)
            for n in (1, 65535, 65536, 70000, 3_000_000):
                encoded = (
                    await conn.execute(text(f"SELECT {pair_sql(store.dialect, '17', ':n')}"), {"n": n})
                ).scalar()
                hist = dense([decoded(encoded)])
                assert hist[17] == n and hist.sum() == n
    finally:
        await store.close()
