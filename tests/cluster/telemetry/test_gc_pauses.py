"""The collector's pause timer and the start-up freeze (cluster/telemetry/gc_pauses.py)."""

from __future__ import annotations

import gc

from cluster.telemetry.gc_pauses import YOUNG_OBJECTS, GcPauses, freeze_heap, settle_for_serving, thaw_heap


def test_each_collection_is_timed_under_its_generation() -> None:
    pauses = GcPauses().install()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        snap = pauses.snapshot()
    finally:
        pauses.uninstall()
    gens = snap["generations"]
    assert gens[0]["collections"] >= 1 and gens[2]["collections"] >= 2
    assert gens[2]["max_ms"] > 0 and gens[2]["total_ms"] >= gens[2]["max_ms"]
    assert snap["max_ms"] == max(g["max_ms"] for g in gens)
    gc.collect(2)  # uninstalled: no longer counted
    assert pauses.snapshot()["generations"][2]["collections"] == gens[2]["collections"]
    pauses.reset()
    assert all(g["collections"] == 0 for g in pauses.snapshot()["generations"])


def test_the_frozen_heap_is_left_out_of_full_collections() -> None:
    kept = [[i] for i in range(50_000)]  # lists are tracked: each is walked by a full collection
    try:
        frozen = freeze_heap()
        assert frozen >= len(kept) and GcPauses().snapshot()["frozen_objects"] == frozen
        assert len(gc.get_objects(2)) < len(kept)  # the oldest generation no longer holds them
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0 and GcPauses().snapshot()["frozen_objects"] == 0
    assert len(gc.get_objects(2)) >= len(kept)  # unfrozen: back in the oldest generation


def test_a_serving_process_freezes_and_collects_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        assert settle_for_serving() > 0
        assert gc.get_threshold() == (YOUNG_OBJECTS, before[1], before[2])
        assert GcPauses().snapshot()["thresholds"] == [YOUNG_OBJECTS, before[1], before[2]]
    finally:
        thaw_heap()
        gc.set_threshold(*before)


def test_a_snapshot_does_not_walk_the_frozen_heap() -> None:
    """A replica's load report carries a snapshot; gc.get_freeze_count() walks every frozen object
    (4.5 ms for 500,000 on the CPU box), which stalled the engine thread when it was in the report."""
    kept = [[i] for i in range(300_000)]
    calls = []
    real = gc.get_freeze_count
    try:
        freeze_heap()
        gc.get_freeze_count = lambda: calls.append(1) or real()  # type: ignore[assignment]
        assert GcPauses().snapshot()["frozen_objects"] >= len(kept)
        assert calls == []
    finally:
        gc.get_freeze_count = real  # type: ignore[assignment]
        thaw_heap()
