"""How the writer's tasks sleep and stop on the ledger's thread, and take rows from its queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

log = logging.getLogger(__name__)


async def wait_wake(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` passes; the event is cleared after. The wait runs in
    the caller's task: no inner task whose result could race a cancel (``stop_task``)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    event.clear()


async def stop_task(task: asyncio.Task) -> None:
    """End ``task``, interrupting what it awaits. A cancel alone is not enough: on Python 3.11
    ``asyncio.wait_for`` (inside a driver) returns normally when the cancel races the result it
    waited for, and the task runs on (a close hung forever, 1 run in ~16 of the outage-restart
    test). The caller sets its stop flag first, so the loop ends at its next turn whatever became
    of the cancel; ``asyncio.wait`` never swallows one of ours."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.warning("ledger: a writer task failed: %r", task.exception())


def take(queue: deque, n: int) -> list[Any]:
    """Up to ``n`` rows from the front (another thread may pop meanwhile: never raises)."""
    out = []
    with contextlib.suppress(IndexError):
        for _ in range(n):
            out.append(queue.popleft())
    return out


def first_time(queue: deque) -> float | None:
    try:
        return queue[0][0]
    except IndexError:  # emptied by the thread meanwhile
        return None
