"""Fixtures of the load-test tests: a fake SSE server, and the real cluster for the agreement test.

The real cluster is shared: when ``tests/cluster`` already started Ray + Serve and its ``fl-test``
app in this session, the agreement test reuses them (same port, same app); run alone, it starts
them the same way (``tests.cluster.helpers``) and shuts them down at the end.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.loadtest.fake_server import FakeState, fake_server

CLUSTER_APP = "fl-test"  # the name tests/cluster/conftest.py deploys under


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeState]]:
    with fake_server() as served:
        yield served


def _running_serve_port() -> int | None:
    import ray
    from ray.serve.context import _get_global_client

    if not ray.is_initialized():
        return None
    try:
        return int(_get_global_client().http_config.port)
    except Exception:  # Serve not started in this Ray instance
        return None


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running fairlane app (SmolLM2 on CPU, demo tenants with generous quotas)."""
    import ray
    from ray import serve

    from tests.cluster.helpers import start_app, start_test_ray, write_tenancy
    from tests.redis_server import free_port

    port = _running_serve_port()
    owned = port is None
    temp_dir = None
    if owned:
        temp_dir = start_test_ray()
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    status = serve.status().applications.get(CLUSTER_APP)
    if status is None or status.status != "RUNNING":
        tenancy = write_tenancy(tmp_path_factory.mktemp("lt-tenancy") / "tenants.yaml")
        config = {
            "engine": {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
            "tenancy_config": str(tenancy),
            "replica_room": 2,
            "load_poll_interval_s": 0.5,
        }
        start_app(CLUSTER_APP, "/", config)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if owned:
            serve.shutdown()
            ray.shutdown()
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
