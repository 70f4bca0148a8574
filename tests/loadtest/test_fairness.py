"""Weighted service, backlog detection, max service gap and Jain's index on hand-built traces."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.fairness import (
    backlogged_windows,
    busy_intervals,
    fairness_report,
    jain_index,
    service_events,
    service_per_window,
    window_edges,
)
from tests.loadtest.trace import rec


def test_jain_index_hand_values() -> None:
    assert jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([1, 0]) == pytest.approx(0.5)  # one of two gets all: 1/n
    assert jain_index([1, 2, 3]) == pytest.approx(36 / 42)  # (6)² / (3·14)
    assert jain_index([]) is None and jain_index([0, 0]) is None


def test_service_is_input_plus_twice_output_over_weight() -> None:
    # 10 prompt tokens at the first token (t=1), 2 output tokens at t=1 and t=2, weight 2.
    events = service_events(rec(sent=0, tokens=(1.0, 2.0), prompt=10, weight=2.0))
    assert events == [(1.0, 5.0), (1.0, 1.0), (2.0, 1.0)]
    assert service_events(rec(status="timeout", end=3.0)) == []


def test_service_per_window_bins_by_arrival_time() -> None:
    edges = window_edges(0.0, 4.0, 2.0)
    assert edges.tolist() == [0.0, 2.0, 4.0]
    got = service_per_window([rec("a", 0, (1.0, 3.0), prompt=4), rec("b", 0, (2.5,), prompt=0)], edges)
    assert got["a"].tolist() == [4 + 2, 2]  # prompt 4 + one output (×2) in [0,2); one output in [2,4)
    assert got["b"].tolist() == [0, 2]


def test_backlog_needs_a_busy_span_covering_the_window() -> None:
    records = [rec(sent=0.0, tokens=(1.0,), end=3.0), rec(sent=3.01, tokens=(4.0,), end=5.0)]
    assert busy_intervals(records) == [(0.0, 5.0)]  # a 10 ms hand-over gap is bridged
    assert busy_intervals(records, gap_s=0.0) == [(0.0, 3.0), (3.01, 5.0)]
    assert backlogged_windows(records, np.array([0.0, 2.0, 4.0, 6.0])).tolist() == [True, True, False]


def test_max_service_gap_only_between_backlogged_tenants() -> None:
    # Window [0, 2): a and b are both busy throughout; a gets 2 + 6 = 8, b gets 0 + 2 = 2: gap 6.
    # Window [2, 4): only a is busy (b ended at 2.0): not compared.
    a = rec("a", 0.0, (0.5, 1.0, 1.5), prompt=2, end=4.0)
    b = rec("b", 0.0, (1.9,), prompt=0, end=2.0)
    report = fairness_report([a, b], 0.0, 4.0, 2.0)
    assert report.windows_compared == 1
    assert report.max_service_gap == pytest.approx(6.0)
    assert report.max_service_gap_rate == pytest.approx(3.0)
    assert report.jain_backlogged_mean == pytest.approx(100 / (2 * 68))  # (8+2)² / (2·(64+4))
    assert report.jain_overall == pytest.approx(100 / (2 * 68))
    assert report.backlogged == {"a": [True, True], "b": [True, False]}


def test_only_tenants_of_one_class_and_weight_are_compared() -> None:
    # a and b are busy through [0, 2) with very different service, but their classes differ (or
    # their weights): fairness promises nothing between them, so no window is compared.
    a = rec("a", 0.0, (0.5, 1.0, 1.5), prompt=2, end=2.0)
    for b in (
        rec("b", 0.0, (1.9,), prompt=0, end=2.0, sla="batch"),
        rec("b", 0.0, (1.9,), prompt=0, end=2.0, weight=2),
    ):
        report = fairness_report([a, b], 0.0, 2.0, 2.0)
        assert report.windows_compared == 0 and report.max_service_gap is None
        assert "(SLA class, weight) group" in report.definition
