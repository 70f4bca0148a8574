"""Rendering the fairlane chart with real Helm (helm-python-sdk, Helm's Go SDK as a library)."""

from __future__ import annotations

import base64
import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "fairlane"
CI_DIR = CHART_DIR / "ci"
RELEASE = "fl"
NAMESPACE = "llm"
CRD_KINDS = {"RayService", "ServiceMonitor"}


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART_DIR)


def ci_values(name: str) -> dict[str, Any]:
    return yaml.safe_load((CI_DIR / name).read_text(encoding="utf-8"))


def chart_defaults() -> dict[str, Any]:
    return yaml.safe_load((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))


def merged(base: dict[str, Any] | None, override: dict[str, Any]) -> dict[str, Any]:
    """A deep merge of ``override`` into a copy of ``base`` (None deletes a key, as in Helm)."""
    out = copy.deepcopy(base or {})
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Rendered:
    """The objects of one render, with the raw text of each template and NOTES.txt."""

    docs: tuple[dict[str, Any], ...]
    texts: dict[str, str]
    notes: str

    def kinds(self) -> set[str]:
        return {d["kind"] for d in self.docs}

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        if len(found) != 1:
            raise LookupError(f"expected one {kind} {name or ''}, found {len(found)}")
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(d["metadata"]["name"] == name for d in self.all(kind))

    def secret_data(self, name: str) -> dict[str, str]:
        data = self.one("Secret", name).get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    @property
    def rayservice(self) -> dict[str, Any]:
        return self.one("RayService")

    @property
    def cluster(self) -> dict[str, Any]:
        return self.rayservice["spec"]["rayClusterConfig"]

    @property
    def serve_config(self) -> dict[str, Any]:
        return yaml.safe_load(self.rayservice["spec"]["serveConfigV2"])

    @property
    def app_args(self) -> dict[str, Any]:
        (app,) = self.serve_config["applications"]
        return app["args"]

    def pod_templates(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(where, pod template) of the Ray head, each worker group and each workload object."""
        yield "head", self.cluster["headGroupSpec"]["template"]
        for group in self.cluster.get("workerGroupSpecs", []):
            yield f"worker:{group['groupName']}", group["template"]
        for kind in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
            for doc in self.all(kind):
                yield f"{kind}:{doc['metadata']['name']}", doc["spec"]["template"]

    def containers(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        """(where, container, pod spec) of every container and init container."""
        for where, template in self.pod_templates():
            spec = template["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield f"{where}/{c['name']}", c, spec


def render(values: dict[str, Any] | None = None) -> Rendered:
    """Render the chart as ``helm install fl ./helm/fairlane -n llm -f <values>`` would (offline)."""
    manifests = chart().render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path in sorted(manifests):
        if path.endswith((".yaml", ".yml")):
            docs.extend(d for d in yaml.safe_load_all(manifests[path]) if d)
    notes = next((t for p, t in manifests.items() if p.endswith("NOTES.txt")), "")
    return Rendered(docs=tuple(docs), texts=manifests, notes=notes)


VARIANTS: dict[str, Any] = {
    "default": lambda: None,
    "all-options": lambda: ci_values("all-options-values.yaml"),
    "external-redis": lambda: ci_values("external-redis-values.yaml"),
    "ledger-postgresql": lambda: ci_values("ledger-postgresql-values.yaml"),
}


@functools.cache
def render_variant(name: str) -> Rendered:
    return render(VARIANTS[name]())
