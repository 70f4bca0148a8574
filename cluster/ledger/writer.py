"""The ledger's writer: rows leave the request path through a queue and reach the database in batches.

``put`` only appends to an in-memory deque (no await, no I/O), so a request never waits on the
database. A background task writes the queue every ``interval_s`` or as soon as ``batch_rows``
are waiting. When a write fails (the database is down), the rows go to the spill file, and the
writer tries the database again at most every ``retry_s``; once it answers, the spill file is
replayed first. Inserts ignore request ids already stored, so a replay after a write whose answer
was lost stores each row once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import SpillFile
from cluster.ledger.store import LedgerStore

log = logging.getLogger(__name__)
State = Literal["ok", "behind", "spilling"]


@dataclass(frozen=True, slots=True)
class WriterSettings:
    interval_s: float = 0.2
    batch_rows: int = 500
    retry_s: float = 1.0
    write_timeout_s: float = 10.0  # one batch's insert, at most (``LedgerWriter._insert``)
    behind_after_s: float = 5.0  # rows waiting longer than this: /health says "behind"


class LedgerWriter:
    """One router's rows on their way to the database. Single event loop: no locks but the flush's."""

    def __init__(self, store: LedgerStore, spill: SpillFile, settings: WriterSettings | None = None) -> None:
        self.store = store
        self.spill = spill
        self.settings = settings or WriterSettings()
        self.pending: deque[LedgerRow] = deque()
        self.written = 0
        self.write_errors = 0
        self.last_write = time.time()
        self.migrated = False
        self._oldest_pending: float | None = None
        self._next_try = 0.0
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    # ---- the request path ---------------------------------------------------------------------
    def put(self, row: LedgerRow) -> None:
        """Queue a row; never blocks, never raises."""
        if not self.pending:
            self._oldest_pending = time.monotonic()
        self.pending.append(row)
        if len(self.pending) >= self.settings.batch_rows:
            self._wake.set()

    # ---- state ----------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        if self.spill.rows > 0 or self._next_try > time.monotonic():
            return "spilling"
        waited = time.monotonic() - self._oldest_pending if self.pending and self._oldest_pending else 0.0
        return "behind" if waited > self.settings.behind_after_s else "ok"

    @property
    def last_write_age_s(self) -> float:
        """Seconds since the writer was last caught up (every row of this router stored)."""
        return max(0.0, time.time() - self.last_write)

    # ---- the background task --------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop the task and write what is queued (to the spill file if the database will not take it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush(force=True)
        except Exception as exc:
            log.warning("ledger: final write failed (%s); spilling %d rows", exc, len(self.pending))
        await asyncio.to_thread(self._spill_all)
        await asyncio.to_thread(self.spill.close)
        await self.store.close()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.interval_s)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # never let the task die: the next tick tries again
                log.warning("ledger: flush failed: %s", exc)

    async def flush(self, force: bool = False) -> None:
        """Write every queued row (and replay the spill file) if the database answers; else spill.
        ``force``: try the database now even inside the retry back-off."""
        async with self._flush_lock:
            if not force and time.monotonic() < self._next_try:
                if len(self.pending) >= self.settings.batch_rows:  # keep memory small while down
                    await asyncio.to_thread(self._spill_all)
                return
            try:
                await self._write_all()
                self._oldest_pending = None
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
        while self.pending:
            size = min(len(self.pending), 4 * self.settings.batch_rows)
            batch = [self.pending.popleft() for _ in range(size)]
            try:
                await self._insert(batch)
            except BaseException:  # a timeout's cancel too: the rows go back, in order, to be spilled
                self.pending.extendleft(reversed(batch))
                raise
            self._wrote(len(batch))

    def _wrote(self, rows: int) -> None:
        self.written += rows
        self.last_write = time.time()

    def _spill_all(self) -> None:
        rows = list(self.pending)
        self.pending.clear()
        self._oldest_pending = None
        if rows:
            self.spill.append(rows)

    async def _replay(self) -> None:
        """The spill files (this writer's, then any dead writer's) into the database."""
        if self.spill.rows:
            rows = await asyncio.to_thread(self.spill.read_own)
            await self._insert_all(rows)
            await asyncio.to_thread(self.spill.clear_own)
        for path in await asyncio.to_thread(self.spill.others):
            with self.spill.adopt(path) as rows:
                if rows:
                    await self._insert_all(rows)

    async def _insert_all(self, rows: list[LedgerRow]) -> None:
        step = 4 * self.settings.batch_rows
        for i in range(0, len(rows), step):
            await self._insert(rows[i : i + step])
            self._wrote(len(rows[i : i + step]))

    async def _insert(self, rows: list[LedgerRow]) -> None:
        """One bounded write: a batch that takes longer is an outage (a silent network, not only a
        refused port), spilled rather than waited on. A replay interrupted so is replayed whole
        later; the insert ignores the rows already stored."""
        async with asyncio.timeout(self.settings.write_timeout_s):
            await self.store.insert(rows)
