"""The longest single steps of the router's event loop: what one request's work holds it for.

``LoopLag`` says how late a probe woke, which at load is the sum of many callbacks. Issue 22's
bound is per step: no single request may hold the loop longer than 1 ms. ``LoopHolds`` times every
step of every task the watched loop runs and keeps the count over the bound and the longest ones
with what ran: the task's coroutine and the innermost one it stopped in (``Ingress.chat_completions
> JobBuilder._encode``).

How: a task factory on the loop wraps each new task's coroutine in ``_TimedCoroutine``, whose
``send`` and ``throw`` (one task step each) are timed. Ray installs uvloop in its workers, whose
callback handles are compiled, so timing ``asyncio.Handle._run`` would see nothing there; a task
factory works on both loops. Plain callbacks that are not task steps (a future's done callback)
are not timed: request work runs in tasks.

Each hold is measured twice: wall time, and this thread's CPU time. On a busy box a step's wall
time also counts the time its thread waited for the GIL held by another thread (Serve's own loop,
a tokenizer thread); CPU time is the step's own work. Cost: a Python-level `send` and two clock
pairs per step, 2.4 µs on the CPU box (1.6 µs per bare `sleep(0)` step, 4.0 µs watched).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

BOUND_S = 0.001
KEPT = 10  # the longest holds kept, with their names


@dataclass(order=True, frozen=True, slots=True)
class Hold:
    cpu_s: float
    wall_s: float
    name: str


class LoopHolds:
    """Installed on the running loop; ``snapshot`` for ``/admin/state``, ``reset`` with the timings."""

    def __init__(self, bound_s: float = BOUND_S) -> None:
        self.bound_s = bound_s
        self.steps = 0
        self.over_bound = 0  # steps whose own CPU time exceeded the bound
        self.max_wall_s = 0.0
        self._longest: list[Hold] = []  # a min-heap of the KEPT longest by CPU time
        self._restore: tuple[asyncio.AbstractEventLoop, Any] | None = None

    def start(self) -> None:
        """Watch the running loop: every task created on it from now on is timed step by step."""
        loop = asyncio.get_running_loop()
        previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Coroutine, **kwargs: Any) -> asyncio.Future:
            timed = _TimedCoroutine(coro, self)
            if previous is not None:
                return previous(loop, timed, **kwargs)
            return asyncio.Task(timed, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        self._restore = (loop, previous)

    def stop(self) -> None:
        """Tasks created from now on are not timed (those already made stay wrapped)."""
        if self._restore is not None:
            loop, previous = self._restore
            loop.set_task_factory(previous)
            self._restore = None

    def record(self, coro: Coroutine, wall_s: float, cpu_s: float) -> None:
        self.steps += 1
        self.max_wall_s = max(self.max_wall_s, wall_s)
        if cpu_s > self.bound_s:
            self.over_bound += 1
        if len(self._longest) < KEPT:
            heapq.heappush(self._longest, Hold(cpu_s, wall_s, step_name(coro)))
        elif cpu_s > self._longest[0].cpu_s:
            heapq.heapreplace(self._longest, Hold(cpu_s, wall_s, step_name(coro)))

    def reset(self) -> None:
        self.steps = self.over_bound = 0
        self.max_wall_s = 0.0
        self._longest = []

    def snapshot(self) -> dict:
        """Milliseconds: the longest holds by CPU time (with wall time and name), the count over the
        bound, and the longest wall-clock hold."""
        longest = sorted(self._longest, reverse=True)
        return {
            "bound_ms": 1000 * self.bound_s,
            "steps": self.steps,
            "over_bound": self.over_bound,
            "max_cpu_ms": 1000 * longest[0].cpu_s if longest else 0.0,
            "max_wall_ms": 1000 * self.max_wall_s,
            "longest": [
                {"cpu_ms": round(1000 * h.cpu_s, 3), "wall_ms": round(1000 * h.wall_s, 3), "name": h.name}
                for h in longest
            ],
        }


class _TimedCoroutine(Coroutine):
    """A task's coroutine whose every step (``send``, ``throw``) is timed for a ``LoopHolds``."""

    __slots__ = ("_coro", "_holds")

    def __init__(self, coro: Coroutine, holds: LoopHolds) -> None:
        self._coro, self._holds = coro, holds

    def send(self, value: Any) -> Any:
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        try:
            return self._coro.send(value)
        finally:
            self._holds.record(self._coro, time.perf_counter() - wall0, time.thread_time() - cpu0)

    def throw(self, *args: Any) -> Any:
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        try:
            return self._coro.throw(*args)
        finally:
            self._holds.record(self._coro, time.perf_counter() - wall0, time.thread_time() - cpu0)

    def close(self) -> None:
        self._coro.close()

    def __await__(self):
        return self._coro.__await__()


def step_name(top: Coroutine) -> str:
    """A task step: its coroutine and the innermost coroutine it stopped in (read after the step:
    the code that held the loop ran just before that await)."""
    inner, at = top, top
    for _ in range(64):  # the await chain: coroutines, async generators, generator delegation
        nxt = getattr(at, "cr_await", None) or getattr(at, "ag_await", None)
        nxt = nxt or getattr(at, "gi_yieldfrom", None)
        if nxt is None or not hasattr(nxt, "__qualname__"):
            break
        at = nxt
        if not _in_asyncio(at):  # asyncio.sleep's own generator and the like say nothing
            inner = at
    name = getattr(top, "__qualname__", None) or repr(top)
    return name if inner is top else f"{name} > {inner.__qualname__}"


_ASYNCIO_DIR = asyncio.__file__.rsplit("/", 1)[0]


def _in_asyncio(coro) -> bool:
    code = getattr(coro, "cr_code", None) or getattr(coro, "ag_code", None) or getattr(coro, "gi_code", None)
    return code is not None and code.co_filename.startswith(_ASYNCIO_DIR)
