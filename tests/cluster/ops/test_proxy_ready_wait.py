"""A Ray started here gives Serve's proxy a minute to answer its first ready check (Serve's own 5 s
killed a proxy still importing on a busy 2-core box, and `serve.start` failed), unless the user set
a wait."""

from __future__ import annotations

import os

import pytest

from cluster.ops.local_cluster import PROXY_READY_VAR, ray_env


def test_sets_a_minute_where_none_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROXY_READY_VAR, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # ray_env extends it: restored after
    ray_env(proxy_grpc=None)
    assert float(os.environ[PROXY_READY_VAR]) == 60.0


def test_a_wait_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROXY_READY_VAR, "12")
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    ray_env(proxy_grpc=None)
    assert os.environ[PROXY_READY_VAR] == "12"
