"""Tenants: a ConfigMap (no keys) and a Secret (key salt and hashes), merged by an init container."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path
from types import ModuleType

import helm_python
import pytest
import yaml

from tenancy.errors import TenancyConfigError
from tenancy.keys import hash_api_key
from tenancy.loader import (
    DEFAULT_CONFIG_PATH,
    DEMO_ADMIN_KEY,
    DEMO_KEY_SALT,
    load_tenancy_config,
    parse_tenancy_config,
)
from tests.helm.chart import CHART_DIR, Rendered, render

CI_SALT = "ci-only-salt-0123456789abcdef"  # helm/fairlane/ci/all-options-values.yaml
H = "hmac-sha256:"


def _demo(key: str) -> str:
    return hash_api_key(key, DEMO_KEY_SALT)


def _merge_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("merge_tenancy", CHART_DIR / "files" / "merge_tenancy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources(rendered: Rendered) -> tuple[dict, dict]:
    volumes = {v["name"]: v for v in rendered.cluster["headGroupSpec"]["template"]["spec"]["volumes"]}
    config_map = rendered.one("ConfigMap", volumes["tenancy-src"]["configMap"]["name"])
    keys_secret = volumes["tenancy-keys"]["secret"]["secretName"]
    return yaml.safe_load(config_map["data"]["tenancy.yaml"]), yaml.safe_load(
        rendered.secret_data(keys_secret)["keys.yaml"]
    )


def test_default_chart_serves_exactly_the_demo_tenancy(default: Rendered) -> None:
    config, keys = _sources(default)
    merged = parse_tenancy_config(_merge_module().merge(config, keys))
    assert merged == load_tenancy_config(DEFAULT_CONFIG_PATH)
    assert merged.admin_key_hash == _demo(DEMO_ADMIN_KEY)
    assert merged.key_salt.get_secret_value() == DEMO_KEY_SALT


def test_ci_tenants_merge_into_a_valid_config(all_options: Rendered) -> None:
    config, keys = _sources(all_options)
    merged = parse_tenancy_config(_merge_module().merge(config, keys))
    assert [t.id for t in merged.tenants] == ["acme", "globex"]
    acme_keys = (hash_api_key("sk-ci-acme-1", CI_SALT), hash_api_key("sk-ci-acme-2", CI_SALT))
    assert merged.tenant("acme").api_key_hashes == acme_keys
    assert merged.admin_key_hash == hash_api_key("sk-ci-admin", CI_SALT)
    assert merged.metrics_key_hash == hash_api_key("sk-ci-metrics", CI_SALT)
    assert merged.sla_class_of("globex").name == "bulk"
    assert merged.gpu_dollars_per_hour == 3.5


def test_configmap_holds_no_key_material(rendered: Rendered) -> None:
    config_map = rendered.one("ConfigMap", rendered.rayservice["metadata"]["name"] + "-tenancy")
    config = yaml.safe_load(config_map["data"]["tenancy.yaml"])
    assert "admin_key_hash" not in config and "key_salt" not in config
    assert all("api_key_hashes" not in t for t in config["tenants"])
    for config_map in rendered.all("ConfigMap"):
        assert all("sha256:" not in text for text in config_map["data"].values())
        assert all(DEMO_KEY_SALT not in text and CI_SALT not in text for text in config_map["data"].values())


def test_salt_lives_in_the_keys_secret(default: Rendered, all_options: Rendered) -> None:
    assert _sources(default)[1]["key_salt"] == DEMO_KEY_SALT
    assert _sources(all_options)[1]["key_salt"] == CI_SALT


def test_overriding_keys_replaces_the_demo_keys_entirely() -> None:
    """Helm merges maps but replaces lists: the demo keys must not survive next to a user's keys."""
    salt = "my-own-secret-salt-0042"
    mine = [
        {"tenant": "alice", "hashes": [hash_api_key("sk-mine", salt)]},
        {"tenant": "bob", "hashes": [hash_api_key("sk-bob", salt)]},
        {"tenant": "carol", "hashes": [hash_api_key("sk-carol", salt)]},
    ]
    keys = {"key_salt": salt, "api_key_hashes": mine, "admin_key_hash": hash_api_key("sk-adm", salt)}
    rendered = render({"tenancy": {"keys": keys}})
    config, keys = _sources(rendered)
    merged = parse_tenancy_config(_merge_module().merge(config, keys))
    assert merged.tenant("alice").api_key_hashes == (hash_api_key("sk-mine", salt),)
    secret = rendered.secret_data("fl-fairlane-tenant-keys")["keys.yaml"]
    assert _demo("sk-fairlane-alice") not in secret and DEMO_KEY_SALT not in secret


def _merge_argv(tmp_path: Path, config: dict, keys: dict) -> tuple[list[str], Path]:
    """The two mounted sources written as the pod sees them, and the merge script's arguments."""
    (tmp_path / "tenancy.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump(keys))
    out = tmp_path / "tenants.yaml"
    paths = {"--config": tmp_path / "tenancy.yaml", "--keys": tmp_path / "keys.yaml", "--out": out}
    return [part for flag, path in paths.items() for part in (flag, str(path))], out


def test_init_container_script_end_to_end(all_options: Rendered, tmp_path: Path) -> None:
    """The script as the pod runs it: read both mounts, write a read-only file, re-run over it."""
    config, keys = _sources(all_options)
    argv, out = _merge_argv(tmp_path, config, keys)
    module = _merge_module()
    assert module.main(argv) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o440
    assert module.main(argv) == 0  # a restarted init container replaces its own read-only file
    assert load_tenancy_config(out).tenant("globex").quotas.daily_token_budget == 100_000_000


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"key_salt": CI_SALT, "admin_key_hash": H + "a" * 64, "api_key_hashes": {}},
            "tenant 'acme' has no api_key_hashes",
        ),
        (
            {
                "key_salt": CI_SALT,
                "admin_key_hash": H + "a" * 64,
                "api_key_hashes": {"acme": [H + "b" * 64], "globex": [H + "c" * 64], "ghost": [H + "d" * 64]},
            },
            "unknown tenants: ghost",
        ),
        (
            {"key_salt": CI_SALT, "api_key_hashes": {"acme": [H + "b" * 64], "globex": [H + "c" * 64]}},
            "no admin_key_hash",
        ),
        (
            {
                "admin_key_hash": H + "a" * 64,
                "api_key_hashes": {"acme": [H + "b" * 64], "globex": [H + "c" * 64]},
            },
            "no key_salt",
        ),
        (
            {
                "key_salt": CI_SALT,
                "admin_key_hash": H + "a" * 64,
                "api_key_hashes": {"acme": [H + "b" * 64], "globex": [H + "b" * 64]},
            },
            "duplicate",
        ),
        (
            {
                "key_salt": CI_SALT,
                "admin_key_hash": "sha256:" + "a" * 64,
                "api_key_hashes": {"acme": [H + "b" * 64], "globex": [H + "c" * 64]},
            },
            "admin_key_hash: plain 'sha256:' key hashes are no longer accepted",
        ),
    ],
)
def test_init_container_stops_the_pod_on_bad_keys(
    all_options: Rendered, tmp_path: Path, keys: dict, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config, _ = _sources(all_options)
    argv, out = _merge_argv(tmp_path, config, keys)
    assert _merge_module().main(argv) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_bad_merged_config_is_a_tenancy_error() -> None:
    """The script validates with the real tenancy loader (present in the image), not a copy of its rules."""
    with pytest.raises(TenancyConfigError):
        _merge_module()._validate({"sla_classes": [], "tenants": [], "admin_key_hash": "x"})


def test_existing_key_secret_is_mounted_and_not_rendered(external: Rendered) -> None:
    assert not external.all("Secret")
    for _, template in external.pod_templates():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["tenancy-keys"]["secret"]["secretName"] == "fairlane-tenant-keys"
        assert volumes["tenancy-keys"]["secret"]["items"] == [{"key": "keys.yaml", "path": "keys.yaml"}]


def test_key_volumes_are_private_and_in_memory(rendered: Rendered) -> None:
    for where, template in rendered.pod_templates():
        if not where.startswith(("head", "worker")):
            continue
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["tenancy-keys"]["secret"]["defaultMode"] == 0o440
        assert volumes["tenancy"]["emptyDir"]["medium"] == "Memory"  # the merged file holds the hashes


def test_keys_go_in_the_secret_not_in_tenants() -> None:
    tenant = {
        "id": "t",
        "display_name": "T",
        "weight": 1,
        "sla_class": "batch",
        "api_key_hashes": [H + "1" * 64],
        "quotas": {
            "requests_per_minute": 1,
            "tokens_per_minute": 1,
            "max_concurrent_requests": 1,
            "max_tokens_per_request": 1,
            "max_context_length": 1,
        },
    }
    with pytest.raises(helm_python.HelmValuesError, match="api_key_hashes"):
        render({"tenancy": {"tenants": [tenant]}})


@pytest.mark.parametrize(
    "bad", ["sk-plaintext-key", "sha256:ABC", "e220f12d412d7405f64222edc0807697", "sha256:" + "e" * 64]
)
def test_only_hmac_hashes_are_accepted_as_keys(bad: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render({"tenancy": {"keys": {"api_key_hashes": [{"tenant": "alice", "hashes": [bad]}]}}})
    with pytest.raises(helm_python.HelmValuesError):
        render({"tenancy": {"keys": {"admin_key_hash": bad}}})


def test_short_salt_is_refused_by_the_schema() -> None:
    """An empty salt is refused by the template (test_rayservice); a short one by the schema."""
    with pytest.raises(helm_python.HelmValuesError, match="key_salt"):
        render({"tenancy": {"keys": {"key_salt": "too-short"}}})


def test_notes_warn_about_the_public_demo_keys(
    default: Rendered, all_options: Rendered, external: Rendered
) -> None:
    assert "PUBLIC demo key" in default.notes and "PUBLIC demo salt" in default.notes
    assert "PUBLIC demo key" not in all_options.notes and "PUBLIC demo salt" not in all_options.notes
    assert "PUBLIC demo key" not in external.notes and "PUBLIC demo salt" not in external.notes
