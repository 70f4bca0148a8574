"""Fairness figures on hand-built service samples."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.sim.summary import _max_gap


def test_max_gap_counts_only_windows_where_both_were_backlogged():
    # tenant 0 gets 10 per sample, tenant 1 gets 4; tenant 1 is idle at sample 3
    service = np.array([[0, 0], [10, 4], [20, 8], [30, 12], [40, 16]], dtype=float)
    backlog = np.array([[1, 1], [1, 1], [1, 1], [1, 0], [1, 1]], dtype=bool)
    groups = {("c", 1.0): [0, 1]}
    assert _max_gap(service, backlog, groups, lag=1) == pytest.approx(6.0)
    assert _max_gap(service, backlog, groups, lag=2) == pytest.approx(12.0)  # window [0, 2] only
    assert _max_gap(service, backlog, groups, lag=3) is None  # every 3-sample window has the idle one


def test_tenants_of_different_groups_are_not_compared():
    service = np.array([[0, 0], [10, 0]], dtype=float)
    backlog = np.ones((2, 2), dtype=bool)
    assert _max_gap(service, backlog, {("a", 1.0): [0], ("b", 1.0): [1]}, lag=1) is None
