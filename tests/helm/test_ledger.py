"""The ledger's database from the chart: the release's PostgreSQL or an external DSN Secret, the DSN in
every Ray pod's env from a Secret and nowhere else."""

from __future__ import annotations

from urllib.parse import urlsplit

from cluster.config import AppConfig
from tests.helm.chart import Rendered, render, render_variant


def _env(rendered: Rendered) -> dict[str, dict]:
    """Where (head, worker group) -> the FAIRLANE_LEDGER_DSN entry of its Ray container, if any."""
    out = {}
    for where, container, _ in rendered.containers():
        if container["name"].startswith("ray-"):
            for e in container.get("env", []):
                if e["name"] == "FAIRLANE_LEDGER_DSN":
                    out[where] = e
    return out


def test_the_release_postgresql_serves_the_ledger() -> None:
    rendered = render_variant("ledger-postgresql")
    name = "fl-fairlane-ledger"
    secret = rendered.secret_data(name)
    dsn = urlsplit(secret["dsn"])
    assert (dsn.scheme, dsn.hostname, dsn.port, dsn.path) == (
        "postgresql",
        f"{name}.llm.svc",
        5432,
        "/fairlane",
    )
    assert dsn.username == "fairlane" and dsn.password == secret["password"] == "ci-ledger-password-5b2e7c"
    assert rendered.has("Service", name)
    statefulset = rendered.one("StatefulSet", name)
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "password"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/var/lib/postgresql/data", "/tmp"}
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"
    ray_env = _env(rendered)
    assert set(ray_env) == {w for w, c, _ in rendered.containers() if c["name"].startswith("ray-")}
    for entry in ray_env.values():
        assert entry["valueFrom"]["secretKeyRef"] == {"name": name, "key": "dsn"}
    config = AppConfig.model_validate(rendered.app_args)
    assert config.ledger and config.ledger_dsn is None  # the DSN comes from the env, never the args


def test_an_external_dsn_secret_reaches_every_ray_pod() -> None:
    rendered = render(
        {"ledger": {"external": {"existingSecret": "billing-db", "existingSecretDsnKey": "url"}}}
    )
    assert not rendered.has("StatefulSet", "fl-fairlane-ledger")
    entries = _env(rendered).values()
    assert entries and all(
        e["valueFrom"]["secretKeyRef"] == {"name": "billing-db", "key": "url"} for e in entries
    )


def test_without_a_database_each_pod_keeps_its_sqlite_file() -> None:
    rendered = render_variant("default")
    assert _env(rendered) == {}
    assert not rendered.has("StatefulSet", "fl-fairlane-ledger")
    assert AppConfig.model_validate(rendered.app_args).ledger_path.startswith("/home/ray/.cache/")


def test_the_ledger_password_is_random_when_not_given() -> None:
    values = {"ledger": {"postgresql": {"enabled": True}}}
    first = render(values).secret_data("fl-fairlane-ledger")["password"]
    second = render(values).secret_data("fl-fairlane-ledger")["password"]
    assert len(first) == 32 and first.isalnum() and first != second


def _spill_mounts(rendered: Rendered) -> dict[str, tuple[dict, dict]]:
    """Where (head, worker group) -> (its ledger-spill volume, its Ray container's mount of it)."""
    out = {}
    for where, container, pod in rendered.containers():
        if container["name"].startswith("ray-"):
            (volume,) = [v for v in pod["volumes"] if v["name"] == "ledger-spill"]
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == "ledger-spill"]
            out[where] = (volume, mount)
    return out


def test_every_ray_pod_keeps_the_spill_on_the_release_claim() -> None:
    """A rolling update replaces the pods, not the claim: the next routers adopt the spilled rows."""
    rendered = render_variant("default")
    spill_dir = AppConfig.model_validate(rendered.app_args).ledger_spill_dir
    claim = rendered.one("PersistentVolumeClaim", "fl-fairlane-ledger-spill")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    mounts = _spill_mounts(rendered)
    assert set(mounts) == {w for w, c, _ in rendered.containers() if c["name"].startswith("ray-")}
    for volume, mount in mounts.values():
        assert volume["persistentVolumeClaim"] == {"claimName": "fl-fairlane-ledger-spill"}
        assert mount["mountPath"] == spill_dir


def test_the_spill_volume_can_be_an_existing_claim_a_node_directory_or_an_emptydir() -> None:
    existing = render({"ledger": {"spill": {"pvc": {"existingClaim": "billing-spill"}}}})
    assert not existing.has("PersistentVolumeClaim", "fl-fairlane-ledger-spill")
    assert {v["persistentVolumeClaim"]["claimName"] for v, _ in _spill_mounts(existing).values()} == {
        "billing-spill"
    }
    node = render({"ledger": {"spill": {"volume": "hostPath"}}})
    paths = {v["hostPath"]["path"] for v, _ in _spill_mounts(node).values()}
    assert paths == {"/var/lib/fairlane/ledger-spill"}
    assert not node.has("PersistentVolumeClaim", "fl-fairlane-ledger-spill")
    scratch = render({"ledger": {"spill": {"volume": "emptyDir"}}})
    assert all(v == {"name": "ledger-spill", "emptyDir": {}} for v, _ in _spill_mounts(scratch).values())
    off = render({"app": {"ledger": False}})
    assert not off.has("PersistentVolumeClaim", "fl-fairlane-ledger-spill")
    assert all("ledger-spill" not in {v["name"] for v in pod["volumes"]} for _, _, pod in off.containers())
