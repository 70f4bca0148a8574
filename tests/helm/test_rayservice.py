"""The RayService and the objects around it are wired to each other and to the values."""

from __future__ import annotations

import re

import helm_python
import pytest

from tests.helm.chart import NAMESPACE, Rendered, chart_defaults, ci_values, merged, render

DEMO_KEYS = chart_defaults()["tenancy"]["keys"]["api_key_hashes"]
HASH = "hmac-sha256:" + "2" * 64


def _container(template: dict, name: str) -> dict:
    (found,) = [c for c in template["spec"]["containers"] if c["name"] == name]
    return found


def test_head_has_no_gpus(rendered: Rendered) -> None:
    head = rendered.cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    resources = _container(head["template"], "ray-head")["resources"]
    assert all("nvidia.com/gpu" not in resources.get(k, {}) for k in ("requests", "limits"))


@pytest.mark.parametrize("variant", ["default", "all-options"])
def test_gpu_worker_group_follows_values(variant: str) -> None:
    override = ci_values("all-options-values.yaml") if variant == "all-options" else {}
    values = merged(chart_defaults(), override)
    rendered = render(None if variant == "default" else values)
    (group,) = rendered.cluster["workerGroupSpecs"]
    w = values["gpuWorkers"]
    assert group["groupName"] == w["groupName"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
        w["replicas"],
        w["minReplicas"],
        w["maxReplicas"],
    )
    assert group["rayStartParams"]["num-gpus"] == str(w["gpusPerPod"])
    resources = _container(group["template"], "ray-worker")["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == w["gpusPerPod"]
    assert resources["limits"]["nvidia.com/gpu"] == w["gpusPerPod"]
    assert resources["limits"]["memory"] == w["resources"]["limits"]["memory"]
    for key, value in w["rayStartParams"].items():
        assert group["rayStartParams"][key] == value
    assert group["template"]["spec"].get("tolerations") == w["tolerations"]
    assert group["template"]["spec"].get("nodeSelector") == (w["nodeSelector"] or None)


def test_ray_start_params_are_strings(rendered: Rendered) -> None:
    groups = [rendered.cluster["headGroupSpec"], *rendered.cluster["workerGroupSpecs"]]
    for group in groups:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group["rayStartParams"]


def test_in_tree_autoscaling_is_on_by_default_and_can_be_turned_off(default: Rendered) -> None:
    assert default.cluster["enableInTreeAutoscaling"] is True
    assert default.cluster["autoscalerOptions"]["upscalingMode"] == "Default"
    off = render({"autoscaler": {"enabled": False}})
    assert off.cluster["enableInTreeAutoscaling"] is False
    assert "autoscalerOptions" not in off.cluster


def test_ray_version_and_image(all_options: Rendered, default: Rendered) -> None:
    assert all_options.cluster["rayVersion"] == "2.60.0"
    head = _container(all_options.cluster["headGroupSpec"]["template"], "ray-head")
    assert head["image"] == "registry.example.com/fairlane/fairlane:0.1.0-cuda"
    assert head["imagePullPolicy"] == "Always"
    default_head = _container(default.cluster["headGroupSpec"]["template"], "ray-head")
    assert default_head["image"].endswith(":0.1.0")  # the chart's appVersion


def test_gcs_fault_tolerance_uses_the_builtin_redis_and_its_secret(default: Rendered) -> None:
    gcs = default.cluster["gcsFaultToleranceOptions"]
    service = default.one("Service", "fl-fairlane-redis")
    assert gcs["redisAddress"] == f"fl-fairlane-redis.{NAMESPACE}.svc:6379"
    assert service["spec"]["ports"][0]["port"] == 6379
    ref = gcs["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] in default.secret_data(ref["name"])
    statefulset = default.one("StatefulSet", "fl-fairlane-redis")
    assert statefulset["spec"]["serviceName"] == "fl-fairlane-redis-headless"
    assert default.has("Service", "fl-fairlane-redis-headless")
    assert set(service["spec"]["selector"].items()) <= set(
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )


def test_external_redis_is_used_as_given(external: Rendered) -> None:
    gcs = external.cluster["gcsFaultToleranceOptions"]
    assert gcs["redisAddress"] == "redis.data.svc.cluster.local:6380"
    assert gcs["redisPassword"]["valueFrom"]["secretKeyRef"] == {"name": "shared-redis", "key": "password"}
    assert "StatefulSet" not in external.kinds()
    assert not any(d["metadata"]["name"].endswith("-redis") for d in external.all("Secret"))
    assert external.app_args["redis_url"] == "redis://redis.data.svc.cluster.local:6380/1"


def test_without_redis_quotas_are_in_memory_and_gcs_ft_is_off() -> None:
    rendered = render(
        {"redis": {"enabled": False}, "gcsFaultTolerance": {"enabled": False}, "app": {"num_routers": 1}}
    )
    assert "gcsFaultToleranceOptions" not in rendered.cluster
    assert "redis_url" not in rendered.app_args
    assert "no Redis configured" in rendered.notes
    for _, container, _ in rendered.containers():
        assert "FAIRLANE_REDIS_PASSWORD" not in {e["name"] for e in container.get("env", [])}


def test_ray_containers_get_the_redis_password_from_the_secret(rendered: Rendered) -> None:
    ref = rendered.cluster["gcsFaultToleranceOptions"]["redisPassword"]["valueFrom"]["secretKeyRef"]
    for where, container, _ in rendered.containers():
        if container["name"].startswith("ray-"):
            env = {e["name"]: e for e in container["env"]}
            assert env["FAIRLANE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref, where


def test_openai_service_selects_ray_pods_on_the_serve_port(rendered: Rendered) -> None:
    service = rendered.one("Service", rendered.rayservice["metadata"]["name"])
    selector = dict(service["spec"]["selector"])
    assert selector.pop("ray.io/serve") == "true"  # set by KubeRay on pods whose Serve proxy is healthy
    for where, template in rendered.pod_templates():
        if where.startswith(("head", "worker")):
            assert set(selector.items()) <= set(template["metadata"]["labels"].items()), where
            containers = template["spec"]["containers"]
            ports = {p["name"]: p["containerPort"] for c in containers for p in c["ports"]}
            target = service["spec"]["ports"][0]["targetPort"]
            assert ports[target] == rendered.serve_config["http_options"]["port"]


def test_ingress_routes_to_the_openai_service(all_options: Rendered) -> None:
    ingress = all_options.one("Ingress")
    service = all_options.one("Service", "fl-ci")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "llm-example-com-tls", "hosts": ["llm.example.com"]}]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "fl-ci"
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"


def test_servicemonitor_scrapes_the_metrics_service(all_options: Rendered) -> None:
    monitor = all_options.one("ServiceMonitor")
    service = all_options.one("Service", "fl-ci-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert set(selector.items()) <= set(service["metadata"]["labels"].items())
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == ports
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
    assert service["spec"]["clusterIP"] == "None"  # every pod is a target
    # fairlane's /metrics answers operators only: the scraper sends the metrics key from a Secret
    [http] = [e for e in monitor["spec"]["endpoints"] if e["port"] == "http"]
    assert http["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "fl-ci-metrics-key", "key": "token"},
    }


def test_optional_objects_are_off_by_default(default: Rendered) -> None:
    assert not {"Ingress", "ServiceMonitor", "NetworkPolicy"} & default.kinds()
    assert not default.has("ConfigMap", "fl-fairlane-dashboard")


def test_network_policy_admits_only_ray_pods_to_redis(all_options: Rendered) -> None:
    policy = all_options.one("NetworkPolicy")
    redis_labels = all_options.one("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert set(policy["spec"]["podSelector"]["matchLabels"].items()) <= set(redis_labels.items())
    (rule,) = policy["spec"]["ingress"]
    expressions = {e["key"]: e["values"] for e in rule["from"][0]["podSelector"]["matchExpressions"]}
    for where, template in all_options.pod_templates():
        labels = template["metadata"]["labels"]
        allowed = all(labels.get(k) in v for k, v in expressions.items())
        assert allowed == where.startswith(("head", "worker")), where


def test_every_volume_mount_has_a_volume_and_every_reference_resolves(rendered: Rendered) -> None:
    existing = {"fairlane-tenant-keys"}  # the external-redis variant's tenancy.keys.existingSecret
    for where, template in rendered.pod_templates():
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        claims = (
            {
                c["metadata"]["name"]
                # this StatefulSet's own claims (Redis, the ledger's PostgreSQL)
                for c in rendered.one("StatefulSet", where.split(":", 1)[1])["spec"].get(
                    "volumeClaimTemplates", []
                )
            }
            if where.startswith("StatefulSet")
            else set()
        )
        for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]:
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes or mount["name"] in claims, f"{where}/{c['name']}: {mount}"
        for volume in volumes.values():
            if "configMap" in volume:
                assert rendered.has("ConfigMap", volume["configMap"]["name"]), where
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert rendered.has("Secret", name) or name in existing, where


def test_pod_annotations_change_when_tenants_change(default: Rendered) -> None:
    """A new tenant or key rolls the Ray pods (KubeRay upgrades the cluster), so the app reloads tenants."""
    before = default.cluster["headGroupSpec"]["template"]["metadata"]["annotations"]
    keys = chart_defaults()["tenancy"]["keys"]["api_key_hashes"]
    keys[1] = {"tenant": "bob", "hashes": ["hmac-sha256:" + "1" * 64]}
    after = render({"tenancy": {"keys": {"api_key_hashes": keys}}})
    annotations = after.cluster["headGroupSpec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/tenant-keys"] != before["checksum/tenant-keys"]
    assert annotations["checksum/tenancy"] == before["checksum/tenancy"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gpuWorkers": {"replicas": 9}}, "gpuWorkers.replicas (9) must lie between"),
        ({"gpuWorkers": {"minReplicas": 3, "replicas": 2}}, "must lie between"),
        ({"app": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}, "max_replicas must be >="),
        ({"app": {"autoscaling": {"initial_replicas": 5}}}, "initial_replicas must lie between"),
        (
            {"app": {"autoscaling": {"max_replicas": 8}}},
            "needs 8 GPUs but gpuWorkers.maxReplicas x gpusPerPod gives 4",
        ),
        (
            {"redis": {"enabled": False}, "gcsFaultTolerance": {"enabled": False}},
            "num_routers > 1 needs Redis",
        ),
        ({"redis": {"enabled": False}, "app": {"num_routers": 1}}, "gcsFaultTolerance.enabled needs Redis"),
        (
            {
                "redis": {"enabled": False},
                "gcsFaultTolerance": {"enabled": False},
                "app": {"num_routers": 1, "router_autoscaling": {"max_routers": 2}},
            },
            "so does router_autoscaling with max_routers > 1",
        ),
        ({"app": {"router_autoscaling": {"min_routers": 3, "max_routers": 2}}}, "max_routers must be >="),
        ({"app": {"router_autoscaling": {"initial_routers": 5}}}, "initial_routers must lie between"),
        ({"redis": {"enabled": False}, "externalRedis": {"host": "r"}}, "needs a Redis password Secret"),
        ({"tenancy": {"keys": {"api_key_hashes": DEMO_KEYS[1:]}}}, "tenant alice has no API key hash"),
        (
            {"tenancy": {"keys": {"api_key_hashes": [*DEMO_KEYS, {"tenant": "eve", "hashes": [HASH]}]}}},
            "eve is not a tenant in tenancy.tenants",
        ),
        (
            {"tenancy": {"keys": {"api_key_hashes": [*DEMO_KEYS, {"tenant": "bob", "hashes": [HASH]}]}}},
            "tenant bob is listed twice",
        ),
        ({"tenancy": {"keys": {"admin_key_hash": ""}}}, "tenancy.keys.admin_key_hash"),
        ({"tenancy": {"keys": {"key_salt": ""}}}, "tenancy.keys.key_salt"),
        (
            {
                "tenancy": {
                    "tenants": [
                        {
                            "id": "t",
                            "display_name": "T",
                            "weight": 1,
                            "sla_class": "gold",
                            "quotas": {
                                "requests_per_minute": 1,
                                "tokens_per_minute": 1,
                                "max_concurrent_requests": 1,
                                "max_tokens_per_request": 1,
                                "max_context_length": 1,
                            },
                        }
                    ],
                    "keys": {"api_key_hashes": [{"tenant": "t", "hashes": [HASH]}]},
                }
            },
            "unknown sla_class gold",
        ),
    ],
)
def test_inconsistent_values_fail_the_render_with_a_clear_message(values: dict, message: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("proxy_grpc,value", [(None, "1"), (True, "1"), (False, "0")])
def test_ray_containers_tell_serve_whether_the_proxy_uses_grpc(proxy_grpc, value) -> None:
    rendered = render({} if proxy_grpc is None else {"app": {"proxy_grpc": proxy_grpc}})
    ray_containers = [(w, c) for w, c, _ in rendered.containers() if c["name"].startswith("ray-")]
    assert ray_containers
    for where, container in ray_containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAY_SERVE_PROXY_USE_GRPC"] == value, where
