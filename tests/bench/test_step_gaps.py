"""bench/step_gaps.py: device idle sorted by the step it came before, and the longest gaps."""

from __future__ import annotations

from bench.step_gaps import report, sort_of

FIELDS = dict.fromkeys(("postprocess_ms", "schedule_ms", "prepare_ms", "launch_ms", "wait_ms"), 0.1)


def _step(i: int, gap: float, masked: int = 0, early: bool = False, prefill: int = 0, idle: float = 0):
    return {
        "step_id": i, "kind": "sample", "batch_size": 8, "num_prefill_tokens": prefill, "gap_ms": gap,
        "idle_ms": idle, "compute_ms": 10.0, "masked_rows": masked, "read_early": early, **FIELDS,
    }  # fmt: skip


def test_idle_is_charged_to_the_sort_of_step_it_came_before() -> None:
    split = _step(2, 4.0, masked=2, early=True, idle=3.0)
    steps = [_step(0, 99.0), _step(1, 0.5), split, _step(3, 1.0, prefill=64)]
    run = report({"mixed@inf": steps}, top=2)["mixed@inf"]
    # The first step's gap is the wait before the run, not a gap between steps: left out.
    assert run["gap_ms"] == 5.5 and run["idle_ms"] == 3.0 and run["compute_ms"] == 30.0
    want = {"steps": 1, "gap_ms": 4.0, "idle_ms": 3.0, "compute_ms": 10.0}
    assert run["by_sort"]["sample:split+early"] == want
    assert run["by_sort"]["sample:plain+prompt"]["gap_ms"] == 1.0
    assert [row["step"] for row in run["longest"]] == [2, 3]
    assert run["longest"][0]["prev_idle_ms"] == 0.0 and run["longest"][0]["this_idle_ms"] == 3.0
    assert sort_of(_step(4, 0.0, masked=1)) == "sample:split"
