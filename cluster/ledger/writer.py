"""The ledger's writer: rows leave the request path through a queue and reach the database in batches.

``put`` runs on the router's loop and only appends to a bounded deque (no await, no I/O, no lock:
a deque's appends and pops are thread-safe), so a request never waits on the database. Everything
else runs on the ledger's own thread (``db_thread.py``), whose loop owns the SQLAlchemy engine: a
task there writes the queue every ``interval_s`` or as soon as ``batch_rows`` are waiting. When a
write fails (the database is down), the rows go to the spill file, and the writer tries the
database again at most every ``retry_s``; once it answers, the spill file is replayed first.
Inserts ignore request ids already stored, so a replay after a write whose answer was lost stores
each row once. The router reads the state and the counters as plain attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from cluster.ledger.db_thread import LedgerThread
from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import SpillFile
from cluster.ledger.store import LedgerStore

log = logging.getLogger(__name__)
State = Literal["ok", "behind", "spilling"]
Queued = tuple[float, LedgerRow]  # (monotonic time put, row): the age /health reports


@dataclass(frozen=True, slots=True)
class WriterSettings:
    interval_s: float = 0.2
    batch_rows: int = 500
    retry_s: float = 1.0
    write_timeout_s: float = 10.0  # one batch's insert, at most (``LedgerWriter._insert``)
    behind_after_s: float = 5.0  # rows waiting longer than this: /health says "behind"
    # Rows the hand-over queue holds at most; past it a row is dropped and counted. The thread
    # takes rows every interval and spills them while the database is away, so only a thread
    # stuck on one batch (``write_timeout_s``) lets the queue grow: 10 s at 1,000 rows/s is 10,000.
    queue_rows: int = 50_000
    # A database that answers, but slower than rows come, would let the queue reach ``queue_rows``
    # and drop: past this many rows queued after a write, the queue goes to the spill file (kept
    # across restarts, ``max_rows`` a file), to be replayed behind what is replaying now.
    spill_after_rows: int = 10_000


class LedgerWriter:
    """One router's rows on their way to the database, written by the ledger's thread."""

    def __init__(self, store: LedgerStore, spill: SpillFile, settings: WriterSettings | None = None) -> None:
        self.store = store
        self.spill = spill
        self.settings = settings or WriterSettings()
        self.thread = LedgerThread()
        self.written = 0
        self.write_errors = 0
        self.queue_dropped = 0  # rows refused by a full queue or put after the close
        self.last_write = time.time()
        self.migrated = False
        self._queue: deque[Queued] = deque()  # the router appends, the ledger's thread pops
        self._inflight: list[Queued] = []  # the batch being inserted
        self._next_try = 0.0
        self._closed = False
        self._stopping = False  # the writing task's loop ends at its next turn (``_stop_task``)
        self._wake = asyncio.Event()  # these two bind to the thread's loop at first use
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    # ---- the request path: O(1), never blocks, never raises ----------------------------------------
    def put(self, row: LedgerRow) -> None:
        """Queue a row for the ledger's thread."""
        queue = self._queue
        if self._closed or len(queue) >= self.settings.queue_rows:
            self.queue_dropped += 1
            return
        queue.append((time.monotonic(), row))
        if len(queue) == self.settings.batch_rows:  # a batch is waiting: wake the thread once
            self.thread.soon(self._wake.set)

    # ---- state, read from any thread ------------------------------------------------------------------
    @property
    def state(self) -> State:
        if self.spill.waiting > 0 or self._next_try > time.monotonic():
            return "spilling"
        since = self._oldest_since()
        waited = time.monotonic() - since if since is not None else 0.0
        return "behind" if waited > self.settings.behind_after_s else "ok"

    @property
    def pending_rows(self) -> int:
        """Rows queued or being inserted."""
        return len(self._queue) + len(self._inflight)

    @property
    def dropped(self) -> int:
        """Rows lost: the spill file or the queue was full (or a row came after the close)."""
        return self.spill.dropped + self.queue_dropped

    @property
    def last_write_age_s(self) -> float:
        """Seconds since the writer was last caught up (every row of this router stored)."""
        return max(0.0, time.time() - self.last_write)

    def _oldest_since(self) -> float | None:
        inflight = self._inflight
        if inflight:
            return inflight[0][0]
        try:
            return self._queue[0][0]
        except IndexError:  # emptied by the thread meanwhile
            return None

    # ---- called from the router's loop ------------------------------------------------------------
    def start(self) -> None:
        """Start the ledger's thread and the writing task on it."""
        self.thread.start()
        self.thread.soon(self._start_task)

    async def flush(self, force: bool = False) -> None:
        """Have the thread write the queue now (before a report reads this router's rows)."""
        self.thread.start()
        await self.thread.call(lambda: self._flush(force))

    async def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (to the spill file if the database will not take it), then stop
        the thread. A writer never started still writes what was put; a second close does nothing."""
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
    def _start_task(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _close(self, timeout_s: float) -> None:
        await self._stop_task()
        try:
            async with asyncio.timeout(timeout_s):
                await self._flush(force=True)
        except Exception as exc:
            log.warning("ledger: final write failed (%s); spilling %d rows", exc, self.pending_rows)
        self._closed = True  # from here ``put`` refuses: what follows is spilled or counted
        await asyncio.to_thread(self._spill_all)
        await asyncio.to_thread(self.spill.close)
        await self.store.close()

    async def _stop_task(self) -> None:
        """End the writing task, interrupting a write in progress. A cancel alone is not enough:
        on Python 3.11 ``asyncio.wait_for`` (here, or inside a driver) returns normally when the
        cancel races the result it waited for, and the task runs on. A close awaiting that task
        hung forever (1 run in ~16 of the outage-restart test). The flag ends the loop at its next
        turn whatever became of the cancel, and ``asyncio.wait`` never swallows one of ours."""
        task, self._stopping = self._task, True
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.warning("ledger: the writing task failed: %r", task.exception())
        self._task = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.interval_s):
                    await self._wake.wait()  # in this task: no inner task whose result races a cancel
            self._wake.clear()
            if self._stopping:  # set by ``_stop_task``, whether or not its cancel got through
                return
            try:
                await self._flush()
            except Exception as exc:  # never let the task die: the next tick tries again
                log.warning("ledger: flush failed: %s", exc)

    async def _flush(self, force: bool = False) -> None:
        """Write every queued row (and replay the spill file) if the database answers; else spill.
        ``force``: try the database now even inside the retry back-off."""
        async with self._flush_lock:
            if not force and time.monotonic() < self._next_try:
                if len(self._queue) >= self.settings.batch_rows:  # keep memory small while down
                    await asyncio.to_thread(self._spill_all)
                return
            try:
                await self._write_all()
                self._next_try = 0.0
                self.last_write = time.time()  # caught up: nothing of this router waits
            except Exception as exc:
                self.write_errors += 1
                self._next_try = time.monotonic() + self.settings.retry_s
                log.warning("ledger: database write failed (%s): spilling", type(exc).__name__)
                await asyncio.to_thread(self._spill_all)

    async def _write_all(self) -> None:
        """Migrate (once), replay spilled rows, then write the queue."""
        if not self.migrated:
            async with asyncio.timeout(self.settings.write_timeout_s):
                await self.store.migrate()
            self.migrated = True
        await self._replay()
        queue = self._queue
        while queue:
            size = min(len(queue), 4 * self.settings.batch_rows)
            batch = [queue.popleft() for _ in range(size)]
            self._inflight = batch
            try:
                await self._insert([row for _, row in batch])
            except BaseException:  # a timeout's cancel too: the rows go back, in order, to be spilled
                queue.extendleft(reversed(batch))
                raise
            finally:
                self._inflight = []
            self._wrote(len(batch))
            await self._spill_if_behind()

    def _wrote(self, rows: int) -> None:
        self.written += rows
        self.last_write = time.time()

    async def _spill_if_behind(self) -> None:
        """Rows coming faster than the database takes them: the queue goes to the spill file."""
        if len(self._queue) > self.settings.spill_after_rows:
            await asyncio.to_thread(self._spill_all)

    def _spill_all(self) -> None:
        queue = self._queue
        rows = [queue.popleft()[1] for _ in range(len(queue))]
        if rows:
            self.spill.append(rows)

    async def _replay(self) -> None:
        """The spill files (this writer's, then any dead writer's) into the database."""
        rows = await asyncio.to_thread(self.spill.take_own)  # moved aside: spills go on meanwhile
        if rows:
            await self._insert_all(rows)
            await asyncio.to_thread(self.spill.replayed)
        for path in await asyncio.to_thread(self.spill.others):
            with self.spill.adopt(path) as rows:
                if rows:
                    await self._insert_all(rows)

    async def _insert_all(self, rows: list[LedgerRow]) -> None:
        step = 4 * self.settings.batch_rows
        for i in range(0, len(rows), step):
            await self._insert(rows[i : i + step])
            self._wrote(len(rows[i : i + step]))
            await self._spill_if_behind()

    async def _insert(self, rows: list[LedgerRow]) -> None:
        """One bounded write: a batch that takes longer is an outage (a silent network, not only a
        refused port), spilled rather than waited on. A replay interrupted so is replayed whole
        later; the insert ignores the rows already stored."""
        async with asyncio.timeout(self.settings.write_timeout_s):
            await self.store.insert(rows)
