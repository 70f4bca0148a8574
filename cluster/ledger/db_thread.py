"""The ledger's own thread: an asyncio loop of its own that runs every database call of a router.

SQLAlchemy's async layer is Python on the loop that awaits it: building a statement, the pool's
checkout, the result's rows (up to 2.3 ms a step on the CPU box, issue 22's bound is 1 ms). On
this thread that work never holds the router's loop; the router only hands coroutines over
(``call``, ``soon``) and reads plain counters. The engine's connections belong to this loop (an
asyncpg connection cannot be used from another), so everything that touches the store runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
JOIN_TIMEOUT_S = 5.0


class LedgerThread:
    """A daemon thread running one event loop until ``stop``."""

    def __init__(self, name: str = "fairlane-ledger") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (once). The loop is made here, so ``soon``/``call`` work at once: what
        they hand over waits in the loop's queue until the thread runs it."""
        if self._thread is not None:
            return
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        """Whether the caller runs on this thread (the tests check the database work does)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` on the thread's loop; O(1) for the caller, never raises."""
        loop = self.loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed at shutdown: nothing to wake
            loop.call_soon_threadsafe(callback, *args)

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the thread's loop and await its result from the caller's loop. The
        caller's cancel (a client gone) cancels the work there too."""
        if self.loop is None or not self.running:
            raise RuntimeError("ledger thread not running")
        future = asyncio.run_coroutine_threadsafe(_awaited(make), self.loop)
        return await asyncio.wrap_future(future)

    async def stop(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Stop the loop (its tasks still pending are cancelled) and wait for the thread, off the
        caller's loop."""
        thread, loop = self._thread, self.loop
        if thread is None or loop is None:
            return
        self.soon(loop.stop)
        await asyncio.to_thread(thread.join, timeout_s)
        if thread.is_alive():
            log.warning("ledger: thread did not stop in %.0f s", timeout_s)

    def _main(self) -> None:
        loop = self.loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:  # as asyncio.run ends: cancel what is left, then close
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    """``make()`` is called on the thread's loop, so whatever it creates binds to that loop."""
    return await make()
