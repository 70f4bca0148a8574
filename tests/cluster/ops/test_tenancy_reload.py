"""Issue 19, defect 5: ``POST /admin/tenants/reload`` reaches every router, on an app with two.

The HTTP proxy hands each request to one router, so these tests send many and read each router's
tenancy version from ``/admin/state`` (which names the router that answered) until both answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve

from cluster.ops.chaos_ray import replica_actor_names, running_replicas
from tenancy import DEMO_KEY_SALT, hash_api_key
from tests.cluster.helpers import ADMIN, ALICE, MODEL, admin_state, start_app, wait_until, write_tenancy

APP, PREFIX = "fl-reload", "/reload"
NEWCOMER_KEY = "sk-test-newcomer-7d41"
LATECOMER_KEY = "sk-test-latecomer-2b9e"
ROUTERS = 2


@pytest.fixture(scope="module")
def reload_app(ray_serve: int, app_config: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """Two routers, in-memory quotas, one replica; a tenancy file of its own (the tests rewrite it)."""
    path = write_tenancy(tmp_path_factory.mktemp("reload") / "tenants.yaml")
    start_app(APP, PREFIX, app_config | {"num_routers": ROUTERS, "tenancy_config": str(path)})
    yield f"http://127.0.0.1:{ray_serve}{PREFIX}", path
    serve.delete(APP)


def _add_tenant(path: Path, tenant_id: str, key: str) -> None:
    data = yaml.safe_load(path.read_text())
    alice = next(t for t in data["tenants"] if t["id"] == "alice")
    hashes = [hash_api_key(key, DEMO_KEY_SALT)]
    data["tenants"].append(alice | {"id": tenant_id, "display_name": tenant_id, "api_key_hashes": hashes})
    path.write_text(yaml.safe_dump(data))


def _reload(base: str) -> httpx.Response:
    return httpx.post(f"{base}/admin/tenants/reload", headers=ADMIN, timeout=60)


def _status(base: str, key: str) -> int:
    """An authenticated request's status on whichever router the proxy picks."""
    return httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code


def _complete(base: str, key: str) -> int:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=120).status_code


def _router_versions(base: str) -> dict[str, str | None]:
    """Router id -> its tenancy version, sampled until every router answered (80 requests at most)."""
    seen: dict[str, str | None] = {}
    for i in range(80):
        state = admin_state(base)
        seen[state["router"]] = state.get("tenancy_version")
        if len(seen) >= ROUTERS and i >= 10:
            break
    return seen


def test_a_reload_through_one_router_reaches_every_router(reload_app: tuple) -> None:
    base, path = reload_app
    assert {_status(base, NEWCOMER_KEY) for _ in range(10)} == {401}
    before = _router_versions(base)
    _add_tenant(path, "newcomer", NEWCOMER_KEY)
    r = _reload(base)
    assert r.status_code == 200, r.text
    # The new key works whichever router a request lands on (before the fix: about half got 401).
    assert [_status(base, NEWCOMER_KEY) for _ in range(40)] == [200] * 40
    assert [_complete(base, NEWCOMER_KEY) for _ in range(6)] == [200] * 6
    body = r.json()
    assert body["status"] == "applied" and (body["routers"], body["routers_applied"]) == (ROUTERS, ROUTERS)
    assert "newcomer" in body["tenants"]
    after = _router_versions(base)
    assert len(after) == ROUTERS and set(after.values()) == {body["version"]}, after
    assert body["version"] not in before.values()


def test_a_bad_config_changes_nothing_anywhere(reload_app: tuple) -> None:
    base, path = reload_app
    good = path.read_text()
    before = _router_versions(base)
    assert len(before) == ROUTERS and len(set(before.values())) == 1, before
    unknown_class = good.replace("sla_class: standard", "sla_class: gold", 1)
    try:
        for bad, problem in (("tenants: [", "invalid YAML"), (unknown_class, "unknown SLA class 'gold'")):
            path.write_text(bad)
            r = _reload(base)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_tenancy_config")
            assert problem in error["message"]
    finally:
        path.write_text(good)
    assert _router_versions(base) == before
    assert [_status(base, ALICE) for _ in range(20)] == [200] * 20


def test_a_router_started_later_enforces_the_published_version(reload_app: tuple) -> None:
    base, path = reload_app
    r = _reload(base)
    assert r.status_code == 200, r.text
    published = r.json()["version"]
    good = path.read_text()
    _add_tenant(path, "latecomer", LATECOMER_KEY)  # the file changes; nobody reloads it
    try:
        old_routers = set(_router_versions(base))
        victim = replica_actor_names(APP, "Router")[0]
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)  # Serve starts another

        def serve_replaced_it() -> bool:
            names = replica_actor_names(APP, "Router")
            running = running_replicas(APP, "Router")
            return victim not in names and len(names) == ROUTERS and running == ROUTERS

        # Sample only once Serve runs the replacement: until then the proxy may still hand a request to
        # the dead actor, and Serve's proxy answers that one with a plain-text 500 (it does not retry).
        assert wait_until(serve_replaced_it, timeout_s=120, interval_s=0.5)

        def replaced() -> bool:
            versions = _router_versions(base)
            return len(versions) == ROUTERS and set(versions) != old_routers

        assert wait_until(replaced, timeout_s=120, interval_s=1.0)
        # The new router read the published version, not the file it would have read alone.
        assert set(_router_versions(base).values()) == {published}
        assert {_status(base, LATECOMER_KEY) for _ in range(30)} == {401}
    finally:
        path.write_text(good)
