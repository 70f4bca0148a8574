"""Every rendered object checked against a schema.

Kubernetes' own (kubernetes-validate, offline, strict) for built-in kinds and pod templates; hand-written
KubeRay v1 and Prometheus Operator field checks for the CRDs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.helm.chart import CRD_KINDS, Rendered

SCHEMAS = Path(__file__).with_name("schemas")
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25", "1.37")


def _k8s_errors(doc: dict[str, Any], version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        return [f"{doc['kind']} {doc['metadata'].get('name')}: {where}: {exc.message}"]
    return []


def _crd_errors(doc: dict[str, Any], schema_file: str) -> list[str]:
    schema = json.loads((SCHEMAS / schema_file).read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_only_known_kinds_are_rendered(rendered: Rendered) -> None:
    """Nothing escapes validation: every kind is a Kubernetes built-in or a CRD the tests check."""
    built_in = {"ConfigMap", "Secret", "Service", "ServiceAccount", "StatefulSet", "Ingress", "NetworkPolicy"}
    built_in |= {"PersistentVolumeClaim"}
    assert rendered.kinds() <= built_in | CRD_KINDS
    assert {"RayService", "ConfigMap", "Service", "ServiceAccount"} <= rendered.kinds()


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_built_in_objects_match_the_kubernetes_schema(rendered: Rendered, version: str) -> None:
    errors = [e for d in rendered.docs if d["kind"] not in CRD_KINDS for e in _k8s_errors(d, version)]
    assert errors == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_ray_pod_templates_match_the_kubernetes_schema(rendered: Rendered, version: str) -> None:
    errors = []
    for where, template in rendered.pod_templates():
        doc = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": where.replace(":", "-")},
            "template": template,
        }
        errors += _k8s_errors(doc, version)
    assert errors == []


def test_strict_kubernetes_validation_rejects_unknown_fields(default: Rendered) -> None:
    """The validator is strict: a misspelt field in a rendered Service or pod template is caught."""
    service = copy.deepcopy(default.one("Service", "fl-fairlane"))
    service["spec"]["selectorr"] = service["spec"].pop("selector")
    assert _k8s_errors(service, "1.30")
    template = copy.deepcopy(default.cluster["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["resourcess"] = {}
    assert _k8s_errors(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}, "1.30"
    )


def test_rayservice_matches_kuberay_v1_fields(rendered: Rendered) -> None:
    assert _crd_errors(rendered.rayservice, "rayservice_v1.schema.json") == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "rayClusterConfig", "enableInTreeAutoscaling"), "yes"),
        (("spec", "rayClusterConfig", "headGroupSpec", "rayStartParams", "num-gpus"), 0),
        (("spec", "rayClusterConfig", "gcsFaultToleranceOptions", "redisAddress"), "redis://x:6379"),
        (("spec", "rayClusterConfig", "workerGroupSpec"), []),
        (("spec", "serveConfig"), "x"),
    ],
)
def test_kuberay_field_check_rejects_wrong_fields(
    default: Rendered, path: tuple[str, ...], value: Any
) -> None:
    doc = copy.deepcopy(default.rayservice)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _crd_errors(doc, "rayservice_v1.schema.json")


def test_servicemonitor_matches_prometheus_operator_fields(all_options: Rendered) -> None:
    monitor = all_options.one("ServiceMonitor")
    assert _crd_errors(monitor, "servicemonitor_v1.schema.json") == []
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["intervall"] = "15s"
    assert _crd_errors(broken, "servicemonitor_v1.schema.json")
