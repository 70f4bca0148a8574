"""The ledger's writer: rows leave the request path through a queue and reach the database (issue 43).

``put`` runs on the router's loop and only appends to a deque (no await, no I/O, no lock). Two tasks
on the ledger's own thread (``db_thread.py``) move the rows on:

* the **drain** writes to the database: first any spilled rows (this writer's, oldest first, then
  a dead writer's files), a chunk at a time, then the queue in batches. Every insert ignores request
  ids already stored, so a chunk or batch sent twice is stored once;
* the **spool** takes the queue to the spill file (``spill.py``, fsync'd once a batch) whenever the
  writer is *spilling*: the database failed, or rows queue faster than it takes them. Once spilling,
  every row goes to disk behind those already there, and the drain replays them in order; when the
  spill is empty again the drain writes the queue directly.

So a slow database costs disk, not rows, and the memory queue never holds more than a spool
interval's rows while spilling. Past its bounds (``backpressure.py``) the router sheds new requests
with 503s rather than drop a row. A close stops both tasks, tries the database for a bounded time,
and spills the rest; the spill thread runs every file call in order, so nothing is appended to a
closed file (``spill_io.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Literal

from cluster.ledger.db_thread import LedgerThread
from cluster.ledger.replay import ReplayCursor
from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import SpillClosed, SpillLog
from cluster.ledger.spill_io import SpillIO
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer_settings import WriterSettings
from cluster.ledger.writer_tasks import first_time, stop_task, take, wait_wake

log = logging.getLogger(__name__)
State = Literal["ok", "behind", "spilling", "shedding"]
Queued = tuple[float, LedgerRow]  # (monotonic time put, row): the age /health reports
MIN_INSERT_ROWS = 50


class LedgerWriter:
    """One router's rows on their way to the database, written by the ledger's thread."""

    def __init__(self, store: LedgerStore, spill: SpillLog, settings: WriterSettings | None = None) -> None:
        self.settings = s = settings or WriterSettings()
        self.store = store
        store.insert_timeout_s = 0.9 * s.write_timeout_s  # cut before the cancel (``store.py``)
        self.spill = spill
        self.thread = LedgerThread()
        self.io = SpillIO()
        self.cursor = ReplayCursor(spill, self.io, s.write_rows)
        self.written = 0  # rows stored, direct or replayed
        self.spilled = 0  # rows appended to the spill file
        self.write_errors = 0
        self.spill_errors = 0  # appends the disk refused (full, unwritable): the router sheds
        self.queue_dropped = 0  # rows refused by a full queue or put after the close
        self.last_write = time.time()
        self.migrated = False
        self.spilling = False  # rows go to the spill file, behind the rows already there
        # An append the disk refused: shed for a retry interval, then admit again (a router that
        # shed until an append succeeded would never append again: shedding means no rows).
        self._spill_failed_until = 0.0
        self._queue: deque[Queued] = deque()  # the router appends; the ledger's threads pop
        self._inflight: list[Queued] = []  # the batch the drain is inserting
        self._spooling = False  # an append is on the spill thread
        self._chunk = s.write_rows  # rows per insert now: small after a timeout, then sized by rate
        self._next_try = 0.0
        self._closed = False
        self._stopping = False
        self._drain_lock = asyncio.Lock()  # one drain step at a time: the loop's, a flush's, the close's
        self._wake_drain = asyncio.Event()  # these bind to the thread's loop at first use
        self._wake_spool = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # ---- the request path: O(1), never blocks, never raises ----------------------------------------
    def put(self, row: LedgerRow) -> None:
        queue = self._queue
        if self._closed or len(queue) >= self.settings.queue_rows:
            self.queue_dropped += 1
            return
        queue.append((time.monotonic(), row))
        if len(queue) == self.settings.batch_rows:  # a batch is waiting: wake the thread once
            self.thread.soon(self._wake_drain.set)

    # ---- state, read from any thread ------------------------------------------------------------------
    @property
    def spill_failed(self) -> bool:
        return time.monotonic() < self._spill_failed_until

    @property
    def shedding(self) -> bool:
        """Whether the router should refuse new requests: one more would risk a dropped row."""
        s, spill = self.settings, self.spill
        return (
            self.spill_failed
            or spill.rows >= s.shed_at * spill.max_rows
            or len(self._queue) >= s.shed_at * s.queue_rows
        )

    @property
    def state(self) -> State:
        if self.shedding:
            return "shedding"
        if self.spill.waiting > 0 or self.spilling or self._next_try > time.monotonic():
            return "spilling"
        since = self._inflight[0][0] if self._inflight else first_time(self._queue)
        waited = time.monotonic() - since if since is not None else 0.0
        return "behind" if waited > self.settings.behind_after_s else "ok"

    @property
    def pending_rows(self) -> int:
        """Rows queued or being inserted."""
        return len(self._queue) + len(self._inflight)

    @property
    def dropped(self) -> int:
        """Rows lost: the queue was full (the router sheds before), or a row came after the close."""
        return self.queue_dropped

    @property
    def last_write_age_s(self) -> float:
        """Seconds since the writer was last caught up (every row of this router stored)."""
        return max(0.0, time.time() - self.last_write)

    # ---- called from the router's loop ------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()
        self.thread.soon(self._start_tasks)

    async def flush(self, force: bool = False) -> None:
        """Have the thread write what it can now (before a report reads this router's rows)."""
        self.thread.start()
        await self.thread.call(lambda: self._flush(force))

    async def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued and spilled for up to ``timeout_s`` (the rest to the spill file, for
        the next writer), then stop the thread. A second close does nothing."""
        if self._closed and not self.thread.running:
            return
        self.thread.start()
        try:
            await self.thread.call(lambda: self._close(timeout_s))
        finally:
            await self.thread.stop()
        late = len(self._queue)
        if late:  # put in the instant between the last spill and the close: said, counted
            self.queue_dropped += late
            log.warning("ledger: %d rows put during the close dropped", late)

    # ---- on the ledger's thread ---------------------------------------------------------------------
    def _start_tasks(self) -> None:
        if not self._tasks and not self._closed:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._drain_loop()), loop.create_task(self._spool_loop())]

    async def _flush(self, force: bool) -> None:
        """Steps until the rows waiting now are written (not those put meanwhile: under steady
        traffic a flush that chased them would never end), or nothing moves."""
        if force:
            self._next_try = 0.0
        target = self.written + self.pending_rows + self.spill.waiting
        while await self.drain_step() and self.written < target:  # one step at least: it migrates
            pass
        if self.spilling and self.written >= target:
            # The spill is replayed: the step that leaves spill mode (its writes go direct again)
            # belongs to this flush, not to whenever the drain task next runs.
            await self.drain_step()
        await self.spool()

    async def _close(self, timeout_s: float) -> None:
        self._stopping = True
        for task in self._tasks:
            await stop_task(task)
        self._tasks = []
        await self.io.barrier()  # an append a cancel left running has ended: its rows are on disk
        self._spooling = False
        # Held to the end: a flush waiting for it finds the writer closed and does nothing (its
        # step could have put a batch back in the queue after the last spill, dropping it).
        async with self._drain_lock:
            try:
                async with asyncio.timeout(timeout_s):
                    while await self._step(with_others=False):
                        pass
            except Exception as exc:
                log.warning("ledger: final write failed (%r); spilling %d rows", exc, self.pending_rows)
            self._closed = True  # from here ``put`` refuses: what follows is spilled or counted
            await self.io.run(self._append_job)
            await self.io.run(self.cursor.release)
            await self.io.run(self.spill.close)
            await self.io.close()
            await self.store.close()

    async def _drain_loop(self) -> None:
        moved = False
        while not self._stopping:
            if not moved:  # a backlog moves without pause; an idle drain waits for rows or a tick
                await wait_wake(self._wake_drain, self.settings.interval_s)
            if self._stopping:
                return
            moved = await self.drain_step()

    async def _spool_loop(self) -> None:
        while not self._stopping:
            await wait_wake(self._wake_spool, self.settings.interval_s)
            if self._stopping:
                return
            try:
                await self.spool()
            except Exception as exc:  # never let the task die: the next tick tries again
                log.warning("ledger: spool failed: %r", exc)

    async def drain_step(self) -> bool:
        """One step toward the database; whether it moved rows. A failure starts spilling."""
        if time.monotonic() < self._next_try:
            return False
        try:
            async with self._drain_lock:
                if self._closed:
                    return False
                moved = await self._step()
        except Exception as exc:
            self._failed(exc)
            return False
        self._next_try = 0.0
        return moved

    def _failed(self, exc: BaseException) -> None:
        self.write_errors += 1
        self._next_try = time.monotonic() + self.settings.retry_s
        if isinstance(exc, TimeoutError):  # maybe only slow: start small, grow at the rate it shows
            self._chunk = MIN_INSERT_ROWS
        if not self.spilling:
            log.warning("ledger: database write failed (%r): spilling", exc)
        self.spilling = True
        self._wake_spool.set()

    async def _step(self, with_others: bool = True) -> bool:
        if not self.migrated:
            async with asyncio.timeout(self.settings.write_timeout_s):
                await self.store.migrate()
            self.migrated = True
        self.cursor.chunk_rows = self._chunk
        chunk = await self.cursor.next_chunk(with_others)
        if chunk is not None:
            await self._insert(chunk.rows)
            await self.cursor.stored(chunk)
            self._stored(len(chunk.rows))
            return True
        if self.spilling:
            if self.spill.waiting or self._spooling:
                return False  # an append is on its way: replay it before writing newer rows
            self.spilling = False  # caught up: the queue is newer than every stored row
            log.info("ledger: spill replayed; writing directly again")
        return await self._write_queue()

    def _stored(self, rows: int) -> None:
        self.written += rows
        if not self._queue and not self.spill.waiting and not self.spilling:
            self.last_write = time.time()  # caught up: nothing of this router waits

    def _sized(self, rows: int, took_s: float) -> None:
        """The next insert's size: what the database took in a quarter of the write timeout at the
        rate it just showed (a slow database gets inserts that end, not timeouts that redo them)."""
        if rows >= self._chunk or took_s > 0.05:
            fits = int(rows / max(took_s, 1e-3) * self.settings.write_timeout_s / 4)
            self._chunk = max(MIN_INSERT_ROWS, min(self.settings.write_rows, fits))

    async def _write_queue(self) -> bool:
        queue = self._queue
        batch = take(queue, min(len(queue), self._chunk))
        if not batch:
            self._stored(0)
            return False
        self._inflight = batch
        try:
            await self._insert([row for _, row in batch])
        except BaseException:  # a timeout's cancel too: the rows go back in front, to be spilled
            queue.extendleft(reversed(batch))
            raise
        finally:
            self._inflight = []
        self._stored(len(batch))
        return True

    async def _insert(self, rows: list[LedgerRow]) -> None:
        began = time.monotonic()
        async with asyncio.timeout(self.settings.write_timeout_s):
            await self.store.insert(rows)
        self._sized(len(rows), time.monotonic() - began)

    async def spool(self) -> int:
        """The queue to disk when spilling, or when it outgrew ``spill_after_rows`` (the database is
        slower than the rows: spilling starts). How many rows were appended. The batch the drain
        is inserting stays with it: stored, or put back in front of the queue to be spilled next."""
        if not self.spilling:
            if len(self._queue) <= self.settings.spill_after_rows:
                return 0
            log.warning("ledger: %d rows queued: the database is behind, spilling", len(self._queue))
            self.spilling = True
        self._spooling = True
        try:
            appended = await self.io.run(self._append_job)
        finally:
            self._spooling = False
        self._wake_drain.set()
        return appended

    def _append_job(self) -> int:
        """On the spill thread: the queue, appended in order. Rows the file refuses (full, a disk
        error, closed) go back to the front of the queue; none is ever lost here."""
        if not self.spill.room:  # full: the rows stay queued (the router sheds), nothing to churn
            return 0
        rows = take(self._queue, len(self._queue))
        if not rows:
            return 0
        try:
            kept = self.spill.append([row for _, row in rows])
        except SpillClosed:
            kept = 0
        except OSError as exc:
            kept, self._spill_failed_until = 0, time.monotonic() + self.settings.retry_s
            self.spill_errors += 1
            log.error("ledger: spill append failed (%r): shedding load until it works", exc)
        self.spilled += kept
        self._queue.extendleft(reversed(rows[kept:]))
        return kept


__all__ = ["LedgerWriter", "WriterSettings"]
