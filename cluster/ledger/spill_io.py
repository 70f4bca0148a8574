"""The spill's one worker thread: every spill-file call of a writer runs here, in the order submitted.

Why one thread and a shield: the old writer ran each append through ``asyncio.to_thread``. A close
cancelled the task awaiting an append whose thread still ran, then closed the file; the append
wrote to a closed file and its rows vanished uncounted (issue 43). Here a job, once submitted,
always runs to its end (a cancel reaches the awaiting task, never the job), and a close submitted
after it runs after it, because a single worker takes jobs first in, first out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class SpillIO:
    """A one-thread executor whose jobs are never abandoned halfway."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairlane-spill")

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future = self._pool.submit(fn, *args)
        future.add_done_callback(_log_failure)
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the spill thread; a cancel of the caller leaves the job running."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(fn, *args)))

    async def barrier(self) -> None:
        """Returns once every job submitted before it has ended."""
        await asyncio.wrap_future(self._pool.submit(lambda: None))

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, True)


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("ledger: spill job failed: %r", future.exception())
