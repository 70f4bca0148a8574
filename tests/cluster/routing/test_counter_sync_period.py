"""Several routers share fair-share counters on a task of their own, every ``counter_sync_s`` (no Ray)."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

from cluster.routing.router_core import RouterCore


def _core(shares: bool) -> tuple[RouterCore, list[float]]:
    core = RouterCore.__new__(RouterCore)  # the pools are all the loop reads
    core.pools = {"m": SimpleNamespace(shared_counters=object() if shares else None)}
    core._counter_sync = None
    calls: list[float] = []

    async def share() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 2:
            raise ConnectionError("Redis went away")  # logged; the next period tries again

    core.share_counters = share
    return core, calls


async def test_counters_are_exchanged_every_period_and_a_failure_does_not_stop_it() -> None:
    core, calls = _core(shares=True)
    core.start_counter_sync(0.02)
    core.start_counter_sync(0.02)  # once only
    await asyncio.sleep(0.2)
    core._counter_sync.cancel()
    assert len(calls) >= 5, calls
    assert all(b - a >= 0.015 for a, b in itertools.pairwise(calls))


async def test_a_router_without_shared_counters_starts_no_task() -> None:
    core, calls = _core(shares=False)
    core.start_counter_sync(0.02)
    await asyncio.sleep(0.05)
    assert core._counter_sync is None and calls == []
