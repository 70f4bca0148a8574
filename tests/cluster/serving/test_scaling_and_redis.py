"""Two routers sharing Redis quotas, and Serve autoscaling of the replicas and of the routers, each on an
app of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from ray import serve

from tests.cluster.helpers import ADMIN, CAPPED_KEY, CAROL, MODEL, start_app, wait_until

REDIS_APP, SCALE_APP, ROUTERS_APP = "fl-redis", "fl-scale", "fl-routers"
SCALE_DIRECT_APP = "fl-scale-direct"


@pytest.fixture  # function scope: redis_prefix (a fresh key prefix) is per test
def redis_app(ray_serve: int, app_config: dict, redis_url: str, redis_prefix: str) -> Iterator[str]:
    config = app_config | {
        "num_routers": 2,
        "redis_url": redis_url,
        "redis_prefix": redis_prefix,
        "replica_room": 8,
    }
    start_app(REDIS_APP, "/redis", config)
    yield f"http://127.0.0.1:{ray_serve}/redis"
    serve.delete(REDIS_APP)


def _post(base: str, key: str, max_tokens: int) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": "Tell me a long story about a cat.",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return httpx.post(
        f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def test_concurrency_cap_holds_across_two_routers(redis_app: str) -> None:
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def one() -> None:
        r = _post(redis_app, CAPPED_KEY, 48)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    codes = [r.status_code for r in results]
    # All 8 arrive within milliseconds and each runs for seconds: exactly the cap (2) is admitted,
    # although the two routers each see about half of them (in-memory stores would admit up to 4).
    assert len(codes) == 8 and codes.count(200) == 2 and codes.count(429) == 6
    refused = [r for r in results if r.status_code == 429]
    assert all(r.json()["error"]["code"] == "concurrency" and "retry-after" in r.headers for r in refused)
    # The slots come back: two new requests are both admitted.
    assert wait_until(lambda: _post(redis_app, CAPPED_KEY, 2).status_code == 200, timeout_s=20)


REPLICA_SCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    # Half a request: the load keeps about one request in the replica at a time (the batch
    # tenant's share of the room), and a target of exactly that made Serve oscillate 1 -> 2 -> 1,
    # stopping the new replica while it was still starting.
    "target_ongoing_requests": 0.5,
    "upscale_delay_s": 1.0,
    "downscale_delay_s": 4.0,
    "metrics_interval_s": 0.5,
}


@pytest.fixture(scope="module")
def scale_app(ray_serve: int, app_config: dict) -> Iterator[str]:
    config = app_config | {"autoscaling": REPLICA_SCALING, "replica_num_cpus": 0.5}
    start_app(SCALE_APP, "/scale", config)
    yield f"http://127.0.0.1:{ray_serve}/scale"
    serve.delete(SCALE_APP)


@pytest.fixture(scope="module")
def scale_direct_app(ray_serve: int, app_config: dict) -> Iterator[str]:
    """Direct dispatch: no request passes Serve's handle, so Serve's own counts stay at zero and the
    replicas scale on their engines' counts (cluster/serving/engine_load_policy.py)."""
    config = app_config | {
        "autoscaling": REPLICA_SCALING,
        "replica_num_cpus": 0.5,
        "stream_channel": True,
        "direct_dispatch": True,
    }
    start_app(SCALE_DIRECT_APP, "/scale-direct", config)
    yield f"http://127.0.0.1:{ray_serve}/scale-direct"
    serve.delete(SCALE_DIRECT_APP)


def _running(app: str, deployment_name: str = "Replica") -> int:
    deployment = serve.status().applications[app].deployments[deployment_name]
    return deployment.replica_states.get("RUNNING", 0)


@pytest.mark.slow
def test_replicas_scale_up_under_load_and_down_after(scale_app: str) -> None:
    _scale_up_and_down(SCALE_APP, scale_app)


@pytest.mark.slow
def test_replicas_scale_under_direct_dispatch_on_their_engines_counts(scale_direct_app: str) -> None:
    _scale_up_and_down(SCALE_DIRECT_APP, scale_direct_app)
    state = httpx.get(f"{scale_direct_app}/admin/state", headers=ADMIN, timeout=10).json()
    assert sum(state["direct_dispatch"].values()) > 0  # the requests went direct, past Serve's handle


def _scale_up_and_down(app: str, url: str) -> None:
    """Four closed-loop clients until a second replica runs; then idle until one is left."""
    assert _running(app) == 1
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            _post(url, CAROL, 32)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        scaled = wait_until(lambda: _running(app) == 2, timeout_s=150, interval_s=0.5)
        assert scaled, serve.status().applications[app].deployments["Replica"]
        room = httpx.get(f"{url}/metrics", headers=ADMIN).text
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert "fairlane_replicas" in room
    started = time.monotonic()
    assert wait_until(lambda: _running(app) == 1, timeout_s=90, interval_s=0.5)
    assert time.monotonic() - started >= 1.0  # not instant: the downscale delay applies


@pytest.fixture
def routers_app(ray_serve: int, app_config: dict, redis_url: str, redis_prefix: str) -> Iterator[str]:
    router_autoscaling = {
        "min_routers": 1,
        "max_routers": 2,
        # Four closed-loop clients keep about four requests open at the router: twice the target of
        # two routers, so the count settles at the most, not on the edge between 1 and 2.
        "target_ongoing_requests": 1.0,
        "upscale_delay_s": 1.0,
        "downscale_delay_s": 4.0,
        "metrics_interval_s": 0.5,
    }
    config = app_config | {
        "router_autoscaling": router_autoscaling, "redis_url": redis_url, "redis_prefix": redis_prefix,
    }  # fmt: skip
    start_app(ROUTERS_APP, "/routers", config)
    yield f"http://127.0.0.1:{ray_serve}/routers"
    serve.delete(ROUTERS_APP)


@pytest.mark.slow
def test_routers_scale_up_on_their_own_load_and_down_after(routers_app: str) -> None:
    assert _running(ROUTERS_APP, "Router") == 1
    stop = threading.Event()
    codes: list[int] = []

    def load() -> None:
        while not stop.is_set():
            codes.append(_post(routers_app, CAROL, 32).status_code)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        scaled = wait_until(lambda: _running(ROUTERS_APP, "Router") == 2, timeout_s=150, interval_s=0.5)
        assert scaled, serve.status().applications[ROUTERS_APP].deployments["Router"]
        # Both routers take requests (the proxy spreads them), and every one is answered.
        before = len(codes)
        assert wait_until(lambda: len(codes) >= before + 4, timeout_s=120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert codes and all(code == 200 for code in codes), codes
    assert _running(ROUTERS_APP, "Replica") == 1  # the routers scaled, not the replicas
    started = time.monotonic()
    assert wait_until(lambda: _running(ROUTERS_APP, "Router") == 1, timeout_s=90, interval_s=0.5)
    assert time.monotonic() - started >= 1.0  # not instant: the downscale delay applies
