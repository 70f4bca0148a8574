"""One Ray instance and one running Serve app shared by every cluster test (start-up is the cost)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray import serve

from tests.cluster.helpers import start_app, write_tenancy
from tests.redis_server import free_port

REPO = str(Path(__file__).resolve().parents[2])
APP = "fl-test"


@pytest.fixture(scope="session")
def ray_serve() -> Iterator[int]:
    """Ray sized for a 2-core box (logical CPUs let several replicas share it) and Serve on a free port."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    port = free_port()
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session")
def tenancy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tenancy(tmp_path_factory.mktemp("tenancy") / "tenants.yaml")


@pytest.fixture(scope="session")
def app_config(tenancy_file: Path) -> dict:
    return {
        "engine": {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
        "tenancy_config": str(tenancy_file),
        "replica_room": 2,
        "load_poll_interval_s": 0.5,
    }


@pytest.fixture(scope="session")
def base_url(ray_serve: int, app_config: dict) -> str:
    """The shared app: one router, in-memory quotas, one SmolLM2 replica on CPU."""
    start_app(APP, "/", app_config)
    return f"http://127.0.0.1:{ray_serve}"
