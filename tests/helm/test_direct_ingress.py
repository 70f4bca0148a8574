"""The edge in the chart: by default Serve's HAProxy ingress (its variables in every Ray pod, nothing
pinned); with ``app.edge: proxy`` and ``app.direct_ingress``, Serve's env in every Ray pod, the routers
pinned to the head pod on known ports, and the Service that reaches those ports (templates/_router.tpl,
service-router.yaml)."""

from __future__ import annotations

import json
import re

import helm_python
import pytest
from ray.serve._private import constants as serve_constants
from ray.serve.schema import ServeDeploySchema

from cluster.app import router_actor_options
from cluster.config import AppConfig
from cluster.edge.ingress import ROUTER_DEPLOYMENT
from cluster.ops.direct_ingress import FIRST_PORT
from tests.helm.chart import Rendered, render

ON = {"app": {"edge": "proxy", "direct_ingress": True, "num_routers": 3}}
ROUTER_SERVICE = "fl-fairlane-router"


@pytest.fixture(scope="module")
def on() -> Rendered:
    return render(ON)


def _ray_envs(rendered: Rendered) -> list[tuple[str, dict[str, str | None]]]:
    envs = [
        (where, {e["name"]: e.get("value") for e in c["env"]})
        for where, c, _ in rendered.containers()
        if c["name"].startswith("ray-")
    ]
    assert len(envs) >= 2  # the head and the GPU workers
    return envs


def _head(rendered: Rendered) -> dict:
    return rendered.cluster["headGroupSpec"]


def test_haproxy_by_default_and_no_router_pinned_for_it(default: Rendered) -> None:
    config = AppConfig.model_validate(default.app_args)
    assert (config.edge, config.direct_ingress) == ("haproxy", False)
    for where, env in _ray_envs(default):
        # HAProxy in place of Serve's proxy, over every router's own port (direct ingress under it).
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1", where
        assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1", where
        assert env["RAY_SERVE_PORT_QUARANTINE_S"] == "0", where
        assert env["RAY_SERVE_HAPROXY_RETRY_ON"] == "conn-failure empty-response", where
    assert not default.has("Service", ROUTER_SERVICE)
    assert "resources" not in _head(default)["rayStartParams"]
    assert "deployments" not in default.serve_config["applications"][0]
    ports = _head(default)["template"]["spec"]["containers"][0]["ports"]
    assert not [p for p in ports if p["name"].startswith("router-")]


def test_the_proxy_edge_without_direct_ingress_sets_both_flags_off() -> None:
    for where, env in _ray_envs(render({"app": {"edge": "proxy"}})):
        # Explicit: an env var left in the image cannot turn either on.
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0", where
        assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0", where
        assert "RAY_SERVE_PORT_QUARANTINE_S" not in env, where


def test_every_ray_process_gets_the_flag_before_ray_starts(on: Rendered) -> None:
    for where, env in _ray_envs(on):
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0", where
        assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1", where
        assert env["RAY_SERVE_PORT_QUARANTINE_S"] == "0", where  # a restarted router gets its port back
    assert AppConfig.model_validate(on.app_args).direct_ingress is True


def test_routers_are_pinned_to_the_head_one_resource_unit_each(on: Rendered) -> None:
    # KubeRay's form of `ray start --resources`: a JSON object inside a quoted string.
    raw = _head(on)["rayStartParams"]["resources"]
    assert raw.startswith('"') and raw.endswith('"')
    assert json.loads(json.loads(raw)) == {"fairlane_router": 3}
    (app,) = on.serve_config["applications"]
    (router,) = app["deployments"]
    assert router["name"] == ROUTER_DEPLOYMENT
    # The override replaces the code's actor options whole: it keeps their runtime env (Serve's loop).
    assert router["ray_actor_options"] == {"num_cpus": 0, "resources": {"fairlane_router": 1}} | {
        "runtime_env": router_actor_options(AppConfig.model_validate(on.app_args))["runtime_env"]
    }
    ServeDeploySchema.model_validate(on.serve_config)  # Serve accepts the config as KubeRay sends it
    for group in on.cluster["workerGroupSpecs"]:
        assert "fairlane_router" not in group["rayStartParams"].get("resources", "")


def test_the_head_exposes_each_routers_port(on: Rendered) -> None:
    assert FIRST_PORT == serve_constants.RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT  # Serve's first port
    ports = {p["name"]: p["containerPort"] for p in _head(on)["template"]["spec"]["containers"][0]["ports"]}
    routers = {name: port for name, port in ports.items() if name.startswith("router-")}
    assert routers == {f"router-{n}": FIRST_PORT + n for n in range(3)}
    assert ports["serve"] == 8000  # the proxy stays on the head, still on Serve's port


def test_the_router_service_reaches_the_head_routers(on: Rendered) -> None:
    service = on.one("Service", ROUTER_SERVICE)
    spec = service["spec"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in spec["ports"]] == [
        (f"router-{n}", 8000 + n, f"router-{n}") for n in range(3)
    ]
    head_labels = _head(on)["template"]["metadata"]["labels"]
    pinned = {k: v for k, v in spec["selector"].items() if k != "ray.io/serve"}
    assert pinned.items() <= head_labels.items()  # the head pod alone
    assert spec["selector"]["ray.io/serve"] == "true"  # once KubeRay sees Serve healthy there
    assert on.one("Service", "fl-fairlane")["spec"]["ports"][0]["port"] == 8000  # the proxy's stays
    assert re.search(rf"svc/{ROUTER_SERVICE}\b", on.notes)


def test_router_port_and_service_type_follow_the_values() -> None:
    rendered = render(ON | {"service": {"type": "NodePort", "routerPort": 9100}})
    spec = rendered.one("Service", ROUTER_SERVICE)["spec"]
    assert spec["type"] == "NodePort" and [p["port"] for p in spec["ports"]] == [9100, 9101, 9102]


def test_own_head_resources_conflict_with_the_pinning() -> None:
    values = ON | {"head": {"rayStartParams": {"resources": '"{\\"x\\": 1}"'}}}
    with pytest.raises(helm_python.HelmError, match=re.escape("head.rayStartParams.resources")):
        render(values)


def test_autoscaled_routers_get_the_head_room_of_the_most() -> None:
    # One resource unit and one port per router that may run, so any of them can start on the head.
    r = render(
        {
            "app": {
                "edge": "proxy",
                "direct_ingress": True,
                "router_autoscaling": {"min_routers": 1, "max_routers": 5},
            }
        }
    )
    assert AppConfig.model_validate(r.app_args).router_autoscaling.max_routers == 5
    assert json.loads(json.loads(_head(r)["rayStartParams"]["resources"])) == {"fairlane_router": 5}
    ports = [p["name"] for p in _head(r)["template"]["spec"]["containers"][0]["ports"]]
    assert [p for p in ports if p.startswith("router-")] == [f"router-{n}" for n in range(5)]
    assert len(r.one("Service", ROUTER_SERVICE)["spec"]["ports"]) == 5
