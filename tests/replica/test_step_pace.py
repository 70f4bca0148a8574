"""replica/profiler.py ``step_pace``: what the replica's back-to-back steps took, summed, for the SLA
policy's speed calibration (cluster/serving/sla_predict.slowdown)."""

from __future__ import annotations

import time

from replica.profiler import StepProfiler, StepRecord, step_pace


def _step(at: float, decode: int, prefill: int = 0, idle_ms: float = 0.0) -> StepRecord:
    return StepRecord(
        step_id=0, at=at, batch_size=decode + (prefill > 0), num_tokens=decode + prefill,
        num_prefill_tokens=prefill, num_sampled=decode, context_tokens=100 * decode, schedule_ms=0.0,
        prepare_ms=0.0, launch_ms=0.0, h2d_ms=0.0, compute_ms=0.0, d2h_ms=0.0, gap_ms=0.0,
        postprocess_ms=0.0, wait_ms=0.0, idle_ms=idle_ms,
    )  # fmt: skip


def test_only_back_to_back_steps_inside_the_window_are_paced() -> None:
    records = [
        _step(0.0, 4),
        _step(0.01, 4),  # before the window
        _step(10.0, 4, idle_ms=9_990.0),  # after an idle spell: its gap is waiting, not a step
        _step(10.02, 4, prefill=64),  # back to back: 20 ms
        _step(10.05, 2),  # 30 ms
    ]
    pace = step_pace(records, since=5.0)
    assert pace["steps"] == 2
    assert pace["decode_rows"] == 6 and pace["prefill_tokens"] == 64 and pace["context_tokens"] == 600
    assert abs(pace["period_s"] - 0.05) < 1e-9


def test_the_profiler_paces_its_recent_records() -> None:
    profiler = StepProfiler(history=100)
    assert profiler.pace()["steps"] == 0
    last = time.monotonic() - 1.0
    for i in range(5):
        profiler.add(_step(last - 0.04 + 0.01 * i, 8))
    pace = profiler.pace(window_s=10.0)
    assert pace["steps"] == 4 and abs(pace["period_s"] - 0.04) < 1e-6
    assert profiler.pace(window_s=0.5)["steps"] == 0  # all of them older than the window
