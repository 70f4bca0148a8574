"""Whether an SLA or usage view flushes the ledger's writer before it reads, and for how long it waits.

A view flushes so that the router reads the rows it served itself. Any tenant may call its views,
so unbounded that was a way to make the writer flush in a loop and to hold a request on a database
that does not answer (issue 43). Now:

* one flush per tenant per ``every_s``: a tenant's call inside its window reads without flushing.
  It loses little: the writer writes its queue on its own every 0.2 s (``WriterSettings.interval_s``),
  so such a read misses at most that much of this router's rows. Reading on (rather than a 429)
  keeps a dashboard that polls both views, or a client that retries, working. The admin (no tenant
  named) is trusted and flushes on every call, within the two bounds below; an admin's
  ``/admin/usage?tenant_id=T`` names T and shares T's window (the views are handed the id alone);
* one flush at a time: a call that finds one running waits for that one;
* a wait of at most ``timeout_s``: past it the view reads what is written, and the flush goes on
  (never cancelled halfway: the writer finishes or spills its batch as it would on its own).

The answer says which (``FlushOutcome``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

log = logging.getLogger(__name__)

FlushOutcome = Literal["flushed", "skipped", "timeout", "failed"]
FLUSH_EVERY_S = 5.0
FLUSH_TIMEOUT_S = 1.0
PRUNE_AT = 1024  # tenant ids remembered before expired windows are forgotten


class ViewFlush:
    """The flush windows of one router's ledger writer."""

    def __init__(
        self,
        every_s: float = FLUSH_EVERY_S,
        timeout_s: float = FLUSH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._last: dict[str, float] = {}  # tenant id -> when its window began
        self._running: asyncio.Future | None = None

    def due(self, tenant_id: str | None) -> bool:
        """Whether a call of ``tenant_id`` (None: the admin's, never windowed) may flush now."""
        last = None if tenant_id is None else self._last.get(tenant_id)
        return last is None or self._clock() - last >= self.every_s

    async def flush(self, flush: Callable[[], Awaitable[None]], tenant_id: str | None) -> FlushOutcome:
        """Flush with ``flush`` (the writer's) for a call of ``tenant_id`` (None for the admin), or
        not, as the module says."""
        if not self.due(tenant_id):
            return "skipped"
        if tenant_id is not None:
            self._begin(tenant_id)
        running = self._running
        if running is None or running.done():
            running = self._running = asyncio.ensure_future(flush())
            running.add_done_callback(_note_failure)
        try:
            await asyncio.wait_for(asyncio.shield(running), self.timeout_s)
        except TimeoutError:
            return "timeout"
        except Exception:  # noted by ``_note_failure``; the view still reads what is written
            return "failed"
        return "flushed"

    def _begin(self, tenant_id: str) -> None:
        now = self._clock()
        if len(self._last) >= PRUNE_AT:  # the admin's filter can name any id: keep the map small
            self._last = {c: t for c, t in self._last.items() if now - t < self.every_s}
        self._last[tenant_id] = now


def _note_failure(done: asyncio.Future) -> None:
    """Log a failed flush (and retrieve its exception, which a timed-out view no longer awaits)."""
    if not done.cancelled() and done.exception() is not None:
        log.warning("ledger flush before a view failed: %r", done.exception())
