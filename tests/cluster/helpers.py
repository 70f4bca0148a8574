"""Shared helpers of the cluster tests: a test tenancy config, app start-up, small HTTP clients."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ray
import yaml
from ray import serve

from cluster.app import build_app
from cluster.ops.local_cluster import ray_env
from tenancy import DEMO_ADMIN_KEY, DEMO_KEY_SALT, DEMO_KEYS, default_tenancy_config, hash_api_key

MODEL = "smollm2-135m"
LIMITED_KEY = "sk-test-limited"  # 2 requests per minute
CAPPED_KEY = "sk-test-capped"  # 2 concurrent requests
ADMIN = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
METRICS_KEY = "sk-test-metrics-reader"  # reads /metrics only
ALICE, BOB, CAROL = DEMO_KEYS["alice"], DEMO_KEYS["bob"], DEMO_KEYS["carol"]


def private_ray_dir() -> str:
    """A temp dir of this process's own for the Ray it starts. Two test workers each start one (the
    ``ray`` and ``ray-faults`` units, tests/xdist_groups.py), and a Ray started in Ray's default temp
    dir is found and joined by the next ``ray.init`` on the machine. Short: Ray's socket paths have a
    length limit."""
    return tempfile.mkdtemp(prefix="fl-ray-", dir="/tmp")


def start_test_ray() -> str | None:
    """Ray sized for a 2-core box (logical CPUs let several replicas share it), in a private temp dir
    (returned; None when this process had a Ray already), started as `fairlane serve` starts it: the
    proxy reaches the routers over gRPC."""
    if ray.is_initialized():
        return None
    ray_env(proxy_grpc=True)
    temp_dir = private_ray_dir()
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    return temp_dir


@contextlib.contextmanager
def ray_and_serve(port: int) -> Iterator[int]:
    """A test Ray (``start_test_ray``) and Serve on ``port``, both stopped at the end."""
    temp_dir = start_test_ray()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _tenant(tid: str, key: str, sla: str, **quotas: int) -> dict:
    base = {
        "requests_per_minute": 6000,
        "tokens_per_minute": 2_000_000,
        "max_concurrent_requests": 64,
        "max_tokens_per_request": 1024,
        "max_context_length": 16384,
    }
    return {
        "id": tid,
        "display_name": tid,
        "api_key_hashes": [hash_api_key(key, DEMO_KEY_SALT)],
        "weight": 1.0,
        "sla_class": sla,
        "quotas": base | quotas,
    }


def write_tenancy(path: Path) -> Path:
    """The demo tenants with generous quotas, plus a rate-limited and a concurrency-capped tenant."""
    data = default_tenancy_config().model_dump(mode="json")
    data["key_salt"] = DEMO_KEY_SALT  # a JSON dump masks the secret salt
    for tenant in data["tenants"]:
        tenant["quotas"] |= {
            "requests_per_minute": 6000,
            "tokens_per_minute": 2_000_000,
            "max_concurrent_requests": 64,
            "max_context_length": 16384,
        }
    data["metrics_key_hash"] = hash_api_key(METRICS_KEY, DEMO_KEY_SALT)
    data["tenants"] += [
        _tenant("limited", LIMITED_KEY, "standard", requests_per_minute=2),
        _tenant("capped", CAPPED_KEY, "standard", max_concurrent_requests=2),
    ]
    path.write_text(yaml.safe_dump(data))
    return path


def start_app(name: str, prefix: str, config: dict) -> None:
    serve.run(build_app(config), name=name, route_prefix=prefix, blocking=False)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        app = serve.status().applications.get(name)
        if app is not None and app.status == "RUNNING":
            return
        time.sleep(0.5)
    raise TimeoutError(f"app {name} did not start")


def deploy_apps(apps: list[tuple[str, str, dict]]) -> None:
    """Deploy every (name, route prefix, config) in one request and return at once; their replicas
    start side by side, and beside whatever the caller does next (``wait_running``). ``serve.run``
    waits for its app to run whatever ``blocking`` says. Room for them is the caller's care: the
    test Ray has 6 logical CPUs (``replica_num_cpus``)."""
    targets = [
        serve.RunTarget(build_app(config), name=name, route_prefix=prefix) for name, prefix, config in apps
    ]
    serve.run_many(targets, wait_for_applications_running=False)


def wait_running(names: list[str], timeout_s: float = 600) -> None:
    """Wait until every named app runs; an app whose deployment failed raises at once."""
    deadline = time.monotonic() + timeout_s
    waiting = set(names)
    while waiting:
        statuses = serve.status().applications
        for name in sorted(waiting):
            app = statuses.get(name)
            if app is not None and app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"app {name} did not start: {app.message}")
        waiting = {n for n in waiting if statuses.get(n) is None or statuses[n].status != "RUNNING"}
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"apps {sorted(waiting)} did not start in {timeout_s:.0f} s")
        if waiting:
            time.sleep(0.5)


def admin_state(base: str) -> dict:
    return httpx.get(f"{base}/admin/state", headers=ADMIN, timeout=10).json()


def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def stream_ttft(base: str, key: str, prompt: str, max_tokens: int) -> float:
    """Client-side time to the first content chunk of a streamed chat completion."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    ttft = None
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if ttft is None and line.startswith("data: {"):
                ttft = time.perf_counter() - start
    assert ttft is not None
    return ttft
