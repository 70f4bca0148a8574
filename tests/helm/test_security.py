"""Security: non-root containers, no privilege escalation, read-only roots, secrets only in Secrets."""

from __future__ import annotations

import base64

import helm_python
import pytest
import yaml

from tests.helm.chart import Rendered, render


def test_every_container_runs_as_non_root_without_escalation(rendered: Rendered) -> None:
    for where, container, pod in rendered.containers():
        sc = container.get("securityContext", {})
        pod_sc = pod.get("securityContext", {})
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
        assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, where
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc.get("privileged", False) is False, where
        assert sc["capabilities"]["drop"] == ["ALL"], where
        assert "add" not in sc["capabilities"], where
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", where


def test_autoscaler_sidecar_is_locked_down_too(rendered: Rendered) -> None:
    sc = rendered.cluster["autoscalerOptions"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_read_only_root_filesystems(rendered: Rendered, all_options: Rendered) -> None:
    for where, container, _ in rendered.containers():
        if container["name"] in {"redis", "tenancy-config"}:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
    # With ray.readOnlyRootFilesystem every Ray container is read-only and gets writable emptyDirs.
    for where, container, pod in all_options.containers():
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
        if container["name"].startswith("ray-"):
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], where
            assert "emptyDir" in volumes[mounts["/home/ray/.cache"]], where
    assert all_options.cluster["autoscalerOptions"]["securityContext"]["readOnlyRootFilesystem"] is True


def test_service_account_tokens_are_not_mounted(rendered: Rendered) -> None:
    for where, template in rendered.pod_templates():
        assert template["spec"]["automountServiceAccountToken"] is False, where
    for account in rendered.all("ServiceAccount"):
        assert account["automountServiceAccountToken"] is False


def _secret_values(rendered: Rendered) -> set[str]:
    """Every secret string: Secret data, and the key salt, each key hash and password inside it."""
    values = set()
    for secret in rendered.all("Secret"):
        for encoded in (secret.get("data") or {}).values():
            value = base64.b64decode(encoded).decode()
            values.add(value)
            loaded = yaml.safe_load(value)
            if isinstance(loaded, dict):
                values.add(loaded["admin_key_hash"])
                values.add(loaded["key_salt"])
                values.update(h for hashes in loaded["api_key_hashes"].values() for h in hashes)
    return values


def test_secrets_never_appear_outside_secrets(rendered: Rendered) -> None:
    secrets = _secret_values(rendered)
    if rendered.all("Secret"):
        assert secrets
    for doc in rendered.docs:
        if doc["kind"] == "Secret":
            continue
        text = yaml.safe_dump(doc) + doc.get("spec", {}).get("serveConfigV2", "")
        leaked = [s for s in secrets if s in text]
        assert leaked == [], f"{doc['kind']} {doc['metadata']['name']}"
    for where, container, _ in rendered.containers():
        assert all(
            s not in " ".join(container.get("args", []) + container.get("command", [])) for s in secrets
        ), where


def test_given_redis_password_is_used_and_only_in_its_secret(all_options: Rendered) -> None:
    assert all_options.secret_data("fl-ci-redis") == {"password": "ci-redis-password-7d1f0a"}
    outside = [d for d in all_options.docs if d["kind"] != "Secret"]
    assert all("ci-redis-password-7d1f0a" not in yaml.safe_dump(d) for d in outside)
    redis = all_options.one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]  # expanded by the kubelet from env
    assert {e["name"] for e in redis["env"]} == {"REDIS_PASSWORD", "REDISCLI_AUTH"}


def test_redis_password_is_random_when_not_given() -> None:
    first = render().secret_data("fl-fairlane-redis")["redis-password"]
    second = render().secret_data("fl-fairlane-redis")["redis-password"]
    assert len(first) == 32 and first.isalnum()
    assert first != second  # random per fresh install (an upgrade reuses the stored one through lookup)


def test_secret_volumes_are_not_world_readable(rendered: Rendered) -> None:
    for where, template in rendered.pod_templates():
        for volume in template["spec"].get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o007 == 0, where


@pytest.mark.parametrize(
    "values",
    [
        {"ray": {"podSecurityContext": {"runAsNonRoot": False}}},
        {"ray": {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 0}}},
        {"ray": {"securityContext": {"allowPrivilegeEscalation": True}}},
        {"ray": {"securityContext": {"allowPrivilegeEscalation": False, "privileged": True}}},
        {"redis": {"podSecurityContext": {"runAsNonRoot": False}}},
        {"redis": {"securityContext": {"allowPrivilegeEscalation": True}}},
    ],
)
def test_schema_refuses_to_weaken_security(values: dict) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(values)
