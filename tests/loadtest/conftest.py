"""Fixtures of the load-test tests: a fake SSE server, and the real cluster for the agreement test.

The real cluster is what a user starts: ``fairlane serve`` with the default edge (Serve's HAProxy in
front of the router's own port, ``cluster/ops/edge.py``), as a subprocess with a Ray of its own
(``tests/cluster/own_serve.py``), so the client's TTFT is measured through the hop users have, not
through Serve's Python proxy that the session's shared Ray runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.helpers import write_tenancy
from tests.cluster.own_serve import own_serve
from tests.faults.fault_helpers import wait_for
from tests.loadtest.fake_server import FakeState, fake_server
from tests.redis_server import free_port

START_TIMEOUT_S = 180.0  # a Ray of its own, a router, HAProxy and SmolLM2 on a busy 2-core box
SERVING = re.compile(r"fairlane serving \S+ at (http://[\d.]+:\d+)/v1")


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeState]]:
    with fake_server() as served:
        yield served


def _serving_url(log: Path) -> str | None:
    match = SERVING.search(log.read_text(errors="replace")) if log.exists() else None
    return match.group(1) if match else None


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of ``fairlane serve`` (SmolLM2 on CPU, the default edge, one router, the demo tenants
    with generous quotas); the tests that take it are ``own_ray``."""
    tmp = tmp_path_factory.mktemp("lt-cluster")
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
        "tenancy_config": str(write_tenancy(tmp / "tenants.yaml")),
        "replica_room": 2,
        "load_poll_interval_s": 0.5,
        "port": free_port(),
    }
    log = tmp / "serve.log"
    with own_serve(tmp, config, prefix="fl-lt-") as proc:
        started = wait_for(
            lambda: _serving_url(log) is not None or proc.poll() is not None, START_TIMEOUT_S, 0.5
        )
        url = _serving_url(log)
        assert started and url is not None, (
            f"fairlane serve did not start:\n{log.read_text(errors='replace')[-4000:]}"
        )
        yield url
