"""The replay's cursor: which spilled rows go to the database next, a chunk at a time.

Own segments first, oldest first (rows this writer spilled, in the order they came), then the files
of writers that are gone, one at a time. A chunk is read on the spill thread (parsing a dead
writer's million rows at once held the ledger's loop for seconds: issue 43), and the cursor moves
past it only once the caller has stored it; a segment goes once its last chunk is stored.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import Segment, SpillLog
from cluster.ledger.spill_io import SpillIO

OTHERS_EVERY_S = 5.0  # how often the folder is searched for dead writers' files


@dataclass(slots=True)
class Chunk:
    rows: list[LedgerRow]
    segment: Segment
    end: int  # byte offset after the chunk
    last: bool  # the segment ends with it


class ReplayCursor:
    """Where the replay stands: a segment and a byte offset in it."""

    def __init__(self, spill: SpillLog, io: SpillIO, chunk_rows: int) -> None:
        self.spill = spill
        self.io = io
        self.chunk_rows = chunk_rows
        self._segment: Segment | None = None
        self._offset = 0
        self._next_search = 0.0
        self._others: list = []

    async def next_chunk(self, with_others: bool = True) -> Chunk | None:
        """The next rows to store (not yet consumed: call ``stored`` after storing them)."""
        if self._segment is None:
            self._segment = await self.io.run(self.spill.oldest)
            if self._segment is None and with_others:
                self._segment = await self._adopt()
            self._offset = 0
        if self._segment is None:
            return None
        rows, end, last = await self.io.run(SpillLog.read, self._segment, self._offset, self.chunk_rows)
        return Chunk(rows, self._segment, end, last)

    async def stored(self, chunk: Chunk) -> None:
        """``chunk`` is in the database: move past it (and delete its segment if it was the last)."""
        if chunk.last:  # the cursor moves first: a cancel during the (shielded) delete leaves it right
            self._segment, self._offset = None, 0
            await self.io.run(self.spill.done, chunk.segment)
        else:
            self._offset = chunk.end

    def adopting(self) -> bool:
        return self._segment is not None and self._segment.adopted

    def release(self) -> None:
        """At the close: an adopted file still being replayed is left, unlocked, to the next writer
        (called on the spill thread, behind every job before it)."""
        if self._segment is not None:
            self.spill.release(self._segment)
            self._segment = None

    async def _adopt(self) -> Segment | None:
        if not self._others:
            now = time.monotonic()
            if now < self._next_search:
                return None
            self._next_search = now + OTHERS_EVERY_S
            self._others = await self.io.run(self.spill.others)
        while self._others:
            job = self.io.submit(self.spill.adopt, self._others.pop(0))
            try:
                segment = await asyncio.shield(asyncio.wrap_future(job))
            except asyncio.CancelledError:  # the file stays locked by the job: let it go again
                job.add_done_callback(lambda done: done.result() and self.spill.release(done.result()))
                raise
            if segment is not None:
                return segment
        return None

    def search_now(self) -> None:
        """Look for dead writers' files at the next chunk (a start, a close)."""
        self._next_search = 0.0
