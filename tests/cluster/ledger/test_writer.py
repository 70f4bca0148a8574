"""The writer: off the request path, batched, and nothing lost through an outage or a restart."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cluster.ledger import metrics
from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.cluster.ledger.rows_factory import rows
from tests.cluster.ledger.tcp_proxy import TcpProxy

FAST = WriterSettings(interval_s=0.05, batch_rows=100, retry_s=0.3, behind_after_s=1.0)


def writer_for(dsn: str, spill_dir: Path, owner: str = "r1") -> LedgerWriter:
    return LedgerWriter(LedgerStore(dsn), SpillLog(spill_dir, owner, max_rows=100_000), FAST)


async def wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(await predicate())


async def test_put_never_waits_and_rows_arrive_in_batches(dsn: str, tmp_path: Path) -> None:
    writer = writer_for(dsn, tmp_path)
    writer.start()
    batch = rows(2000)
    began = time.perf_counter()
    for r in batch:
        writer.put(r)  # synchronous: nothing here can wait on the database
    per_put = (time.perf_counter() - began) / len(batch)
    assert per_put < 50e-6, per_put
    store = LedgerStore(dsn)
    try:
        assert await wait_for(lambda: _count(store, 2000))
        # the rows are visible once the insert commits, a moment before the writer's thread drops
        # them from its in-flight batch: wait for that too, then check it is caught up
        assert await wait_for(lambda: _caught_up(writer)), (writer.state, writer.pending_rows)
        assert writer.spill.waiting == 0
    finally:
        await writer.close()
        await store.close()


async def _caught_up(writer) -> bool:
    return writer.state == "ok" and writer.pending_rows == 0 and writer.written == 2000


async def _count(store: LedgerStore, expected: int) -> bool:
    try:
        return await store.count("app") == expected
    except Exception:  # the table is not there yet
        return False


async def test_an_outage_spills_and_every_row_lands_once(pg_dsn: str, tmp_path: Path) -> None:
    """PostgreSQL unreachable for a few seconds under a steady stream of rows (its port refuses and
    open connections are cut), then back: every row is stored exactly once."""
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    writer = writer_for(through, tmp_path)
    registry = CollectorRegistry()
    metrics.register(registry, writer)
    writer.start()
    sent, states, scraped = 0, set(), ""
    try:
        for phase_s, up in ((1.0, True), (3.0, False), (2.0, True)):
            proxy.start() if up else proxy.stop()
            end = time.monotonic() + phase_s
            while time.monotonic() < end:
                for r in rows(50, seed=sent):
                    writer.put(r)
                sent += 50
                states.add(writer.state)
                if not up and writer.spill.waiting:
                    scraped = generate_latest(registry).decode()
                await asyncio.sleep(0.02)
        assert "spilling" in states
        assert "fairlane_ledger_spilled_rows" in scraped and "fairlane_ledger_write_errors_total" in scraped
        assert writer.write_errors >= 1
        store = LedgerStore(pg_dsn)
        try:
            assert await wait_for(lambda: _count(store, sent)), (await store.count("app"), sent)
            assert await wait_for(_ok(writer))
            assert writer.spill.waiting == 0 and writer.pending_rows == 0
        finally:
            await store.close()
    finally:
        await writer.close()
        proxy.close()


def _ok(writer: LedgerWriter):
    async def check() -> bool:
        return writer.state == "ok"

    return check


async def test_a_restart_during_an_outage_loses_nothing(pg_dsn: str, tmp_path: Path) -> None:
    """A writer that stops while the database is away leaves its rows in its spill file; the next
    writer on the machine replays them once the database is back."""
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    first = writer_for(through, tmp_path, owner="router-a")
    first.start()
    for r in rows(300, seed=1):
        first.put(r)
    proxy.stop()
    for r in rows(200, seed=2):
        first.put(r)
    await first.close(timeout_s=3)
    spilled = list(tmp_path.glob("ledger-spill-*.jsonl"))
    assert spilled and sum(len(p.read_text().splitlines()) for p in spilled) >= 200
    proxy.start()
    second = writer_for(through, tmp_path, owner="router-b")
    second.start()
    store = LedgerStore(pg_dsn)
    try:
        assert await wait_for(lambda: _count(store, 500)), await store.count("app")
        assert not [p for p in tmp_path.glob("ledger-spill-*.jsonl") if p.stat().st_size]
    finally:
        await second.close()
        await store.close()
        proxy.close()


def _replay_all(spill: SpillLog) -> list[str]:
    """Every own row in replay order, chunk by chunk, as the writer's cursor reads them."""
    out = []
    while (segment := spill.oldest()) is not None:
        offset, last = 0, False
        while not last:
            chunk, offset, last = SpillLog.read(segment, offset, 7)
            out += [r.request_id for r in chunk]
        spill.done(segment)
    return out


def test_the_spill_log_is_bounded_and_refuses_rather_than_drops(tmp_path: Path) -> None:
    spill = SpillLog(tmp_path, "r1", max_rows=30)
    assert spill.append(rows(20)) == 20
    assert spill.append(rows(20, seed=3)) == 10  # the other 10 stay with the caller
    assert spill.rows == 30 and spill.room == 0
    assert len(_replay_all(spill)) == 30 and spill.rows == 0
    spill.close()


def test_rows_spilled_during_a_replay_are_kept_and_replayed_in_order(tmp_path: Path) -> None:
    spill = SpillLog(tmp_path, "r1", max_rows=1000, segment_rows=10)
    first, during = rows(25), rows(3, seed=11)
    spill.append(first)  # two sealed segments of 10, a tail of 5
    segment = spill.oldest()
    assert segment is not None
    chunk, offset, last = SpillLog.read(segment, 0, 4)
    spill.append(during)  # the database is slow: more rows spill while the replay runs
    assert not last and [r.request_id for r in chunk] == [r.request_id for r in first[:4]]
    rest = [r.request_id for r in SpillLog.read(segment, offset, 100)[0]]
    spill.done(segment)
    assert rest + _replay_all(spill) == [r.request_id for r in first[4:] + during]
    spill.close()
    assert not list(tmp_path.glob("*.jsonl"))


def test_a_dead_writers_file_is_adopted_once(tmp_path: Path) -> None:
    dead, spilled = SpillLog(tmp_path, "r1", max_rows=100), rows(12)
    dead.append(spilled)
    live = SpillLog(tmp_path, "r2", max_rows=100)
    (path,) = live.others()
    assert live.adopt(path) is None  # its writer lives: the lock is taken
    dead.close()  # stopped (or killed): the lock goes with the process
    segment = live.adopt(path)
    assert segment is not None and segment.adopted
    assert SpillLog.read(segment, 0, 100)[0] == spilled
    assert SpillLog(tmp_path, "r3", max_rows=100).adopt(path) is None  # adopted by one writer only
    live.done(segment)
    assert not live.others()
    live.close()


@pytest.mark.parametrize("garbage", [b'{"request_id": "cut', b"not json\n"])
def test_a_line_cut_by_a_crash_does_not_lose_the_others(tmp_path: Path, garbage: bytes) -> None:
    spill = SpillLog(tmp_path, "r1", max_rows=100)
    spill.append(rows(3))
    (path,) = tmp_path.glob("*.jsonl")
    with path.open("ab") as f:
        f.write(garbage)
    if garbage.endswith(b"\n"):
        spill.append(rows(2, seed=9))
        assert len(_replay_all(spill)) == 5
    else:  # the cut line is the file's last: the writer died writing it
        segment = spill.oldest()
        assert segment is not None and len(SpillLog.read(segment, 0, 100)[0]) == 3
    spill.close()


def test_a_row_dict_holds_every_field_and_round_trips() -> None:
    for row in rows(5, seed=4):
        assert row.to_dict() == dataclasses.asdict(row)
        assert LedgerRow.from_dict(row.to_dict()) == row
