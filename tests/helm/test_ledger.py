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
