"""Python's garbage collector in a serving process: the startup heap frozen, and every pause timed.

A full (generation 2) collection walks every tracked object in the process while holding the GIL:
the event loop, every stream and every other thread wait for it. A router's heap after its imports
(Ray, Serve, FastAPI, pydantic, the tokenizer) holds ~240,000 tracked objects; one full collection
of it took 127-161 ms on the idle CPU box, the size of the router loop's worst lags measured on the H200
(max 198 ms) and of the load generator's (max 235 ms). Those objects live as long as the process,
so ``freeze_heap`` moves them to the permanent generation, which no collection walks again: full
collections then scan only what the process made since (vLLM freezes its heap after its start-up
and warm-up too: `freeze_gc_heap`).

Young collections are made rarer too (``YOUNG_OBJECTS``), and with them the full ones; a router
also bounds them by a clock and holds full ones for a quiet moment (``gc_pacer.py``).
``GcPauses`` times each collection through ``gc.callbacks``: count, total and longest per
generation, for ``/admin/state`` and the load generator's own report.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

# Container objects made (net of those freed) between young collections; Python's default is 700.
# Measured in a router on the H200, after the freeze. At 1.5x overload, 40 s: at 700, 918 young
# collections (longest 12.8 ms) and 7 full ones (up to 102 ms: a full collection walks every
# request waiting in the router's queue); at 10,000, 24 young (up to 28 ms) and 2 middle ones (up
# to 75 ms); at 50,000, 6 young ones (up to 60 ms; 226 ms in all, against 1,177 at 700) and nothing
# older. Short requests through one router, back to back on one machine: 887 requests/s at 50,000,
# 658 at 10,000 (1.11 and 1.40 ms of router + proxy CPU each).
YOUNG_OBJECTS = 50_000
_frozen = 0  # gc.get_freeze_count() walks the frozen list (4.5 ms for 500,000 objects): kept here


def freeze_heap() -> int:
    """Collect once, then freeze what survives; returns how many objects are now frozen. Call it
    when start-up is done (imports, model files, warm-up): later objects are collected as usual."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = gc.get_freeze_count()
    return _frozen


def thaw_heap() -> None:
    """Undo ``freeze_heap``: the frozen objects go back to the oldest generation."""
    global _frozen
    gc.unfreeze()
    _frozen = 0


def settle_for_serving() -> int:
    """A serving process's collector once its start-up is done: the heap frozen and young
    collections rarer (``YOUNG_OBJECTS``); returns the frozen objects' count."""
    frozen = freeze_heap()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_objects(), middle, old)
    return frozen


def young_objects() -> int:
    """``YOUNG_OBJECTS``, or ``FAIRLANE_GC_YOUNG_OBJECTS`` from the environment (for A/B runs:
    Ray's processes inherit it from the shell that starts Ray)."""
    return int(os.environ.get("FAIRLANE_GC_YOUNG_OBJECTS", YOUNG_OBJECTS))


@dataclass(slots=True)
class _Generation:
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0


class GcPauses:
    """Installed once per process (``install``); ``snapshot`` in milliseconds, ``reset`` with the
    other run counters. The callback's own cost is two clock reads per collection; ``snapshot``
    is cheap enough for a replica's load report (a few µs)."""

    def __init__(self) -> None:
        self._gens = [_Generation() for _ in range(3)]
        self._started: float | None = None
        self._installed = False

    def install(self) -> GcPauses:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:  # installed between a start and its stop
            return
        took = time.perf_counter() - self._started
        self._started = None
        gen = self._gens[info["generation"]]
        gen.count += 1
        gen.total_s += took
        gen.max_s = max(gen.max_s, took)

    def reset(self) -> None:
        self._gens = [_Generation() for _ in range(3)]

    def snapshot(self) -> dict[str, object]:
        """Per generation: collections, their total and longest pause (ms); and the frozen heap."""
        return {
            "frozen_objects": _frozen,
            "thresholds": list(gc.get_threshold()),
            "automatic": gc.isenabled(),  # Python's own triggers (a router's pacer keeps the young one)
            "generations": [
                {"collections": g.count, "total_ms": 1000 * g.total_s, "max_ms": 1000 * g.max_s}
                for g in self._gens
            ],
            "max_ms": 1000 * max(g.max_s for g in self._gens),
        }


PROCESS_GC = GcPauses()  # one per process: gc.callbacks is process-wide
