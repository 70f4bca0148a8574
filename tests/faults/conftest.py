"""Shared by every fault test: one Ray + Serve (the cluster tests' instance when they ran first) and
one application with two SmolLM2 replicas, small rooms and bounded queues."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import yaml
from ray import serve
from ray.serve import context as serve_context

from tests.cluster.helpers import ray_and_serve, start_app, write_tenancy
from tests.faults.fault_helpers import FAULT_APP, FAULT_PREFIX, FUZZ_KEY, fuzz_tenant, metered_tenant
from tests.redis_server import free_port

REPO = str(Path(__file__).resolve().parents[2])
QUEUE_PER_TENANT, QUEUE_TOTAL = 16, 40


# Package scope: under two workers the faults are a unit of their own (tests/xdist_groups.py) whose
# worker starts its own Ray; it stops with the package instead of idling beside the units after it.
@pytest.fixture(scope="package")
def fault_port() -> Iterator[int]:
    """The Serve HTTP port: reuse the running Serve (tests/cluster's), or start Ray + Serve here."""
    if ray.is_initialized():
        try:
            yield serve_context._get_global_client().http_config.port
            return
        except Exception:  # Ray without Serve: start Serve below
            pass
    with ray_and_serve(free_port()) as port:
        yield port


@pytest.fixture(scope="session")
def fault_tenancy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster tests' tenants plus a fuzz tenant with tiny limits, and small queue bounds."""
    path = write_tenancy(tmp_path_factory.mktemp("fault-tenancy") / "tenants.yaml")
    data = yaml.safe_load(path.read_text())
    data["tenants"] += [fuzz_tenant(), metered_tenant()]
    data["fair_share"] = data.get("fair_share", {}) | {
        "max_queue_per_tenant": QUEUE_PER_TENANT,
        "max_queue_total": QUEUE_TOTAL,
    }
    path.write_text(yaml.safe_dump(data))
    assert FUZZ_KEY not in path.read_text()  # keys are stored as hashes only
    return path


@pytest.fixture(scope="session")
def fault_config(fault_tenancy: Path) -> dict:
    return {
        "engine": {"device": "cpu", "kv_cache_tokens": 8192, "max_num_seqs": 8},
        "tenancy_config": str(fault_tenancy),
        "num_replicas": 2,
        "replica_num_cpus": 0.5,
        "replica_room": 2,
        "load_poll_interval_s": 0.5,
        "queue_timeout_s": 60.0,
        "first_token_timeout_s": 60.0,
        "token_timeout_s": 15.0,
        "drain_timeout_s": 20.0,
        "max_body_bytes": 1_000_000,
    }


@pytest.fixture(scope="package")
def fault_url(fault_port: int, fault_config: dict) -> Iterator[str]:
    """The shared fault app: one router, in-memory quotas, two replicas on CPU."""
    start_app(FAULT_APP, FAULT_PREFIX, fault_config)
    yield f"http://127.0.0.1:{fault_port}{FAULT_PREFIX}"
    serve.delete(FAULT_APP)
