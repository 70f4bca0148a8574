"""An engine output as the wire carries it: the engine's own stage durations ride on a choice's
last output, measured from the request's arrival at the engine."""

from __future__ import annotations

import pytest

from cluster.serving.wire import output_item
from replica.outputs import RequestMetrics, RequestOutput


def _out(metrics: RequestMetrics | None, reason: str | None) -> RequestOutput:
    return RequestOutput("r1", [7], "x", reason, num_prompt_tokens=3, num_output_tokens=1, metrics=metrics)


def test_the_last_output_carries_the_engines_queue_and_first_token_durations() -> None:
    m = RequestMetrics(arrival=100.0, first_scheduled=100.004, first_token=100.03, finished=100.5)
    item = output_item(_out(m, "stop"), "rep-1", 1, True)
    assert item["engine_queue_s"] == pytest.approx(0.004)
    assert item["engine_ttft_s"] == pytest.approx(0.03)


def test_a_request_that_never_reached_a_step_says_so_with_nulls() -> None:
    item = output_item(_out(RequestMetrics(arrival=5.0), "abort"), "rep-1", 0, True)
    assert item["engine_queue_s"] is None and item["engine_ttft_s"] is None


def test_outputs_before_the_last_carry_no_stage_durations() -> None:
    assert "engine_ttft_s" not in output_item(_out(None, None), "rep-1", 1, False)
