"""cluster.ops.local_cluster.short_router_drain_window: the demo's and the policy benchmark's Ray
hand their processes a 2-s stopping-router window, unless the user set one."""

from __future__ import annotations

import os

import pytest

from cluster.ops.local_cluster import ROUTER_DRAIN_WINDOW_VAR, short_router_drain_window


def test_sets_the_window_where_none_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROUTER_DRAIN_WINDOW_VAR, raising=False)
    short_router_drain_window()
    assert os.environ[ROUTER_DRAIN_WINDOW_VAR] == "2"
    monkeypatch.delenv(ROUTER_DRAIN_WINDOW_VAR)
    short_router_drain_window(0.5)
    assert os.environ[ROUTER_DRAIN_WINDOW_VAR] == "0.5"


def test_a_window_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROUTER_DRAIN_WINDOW_VAR, "45")
    short_router_drain_window()
    assert os.environ[ROUTER_DRAIN_WINDOW_VAR] == "45"
