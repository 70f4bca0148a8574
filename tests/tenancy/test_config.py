from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tenancy import (
    DEMO_ADMIN_KEY,
    DEMO_KEY_SALT,
    DEMO_KEYS,
    Authenticator,
    TenancyConfigError,
    default_tenancy_config,
    hash_api_key,
    load_tenancy_config,
)
from tenancy.loader import parse_tenancy_config
from tests.tenancy.helpers import config_data, tenant


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_default_config_has_three_classes_and_demo_tenants() -> None:
    config = default_tenancy_config()
    assert [c.name for c in config.sla_classes] == ["interactive", "standard", "batch"]
    assert {t.id for t in config.tenants} == set(DEMO_KEYS)
    assert config.gpu_dollars_per_hour == 5.0
    auth = Authenticator(config)
    for tenant_id, key in DEMO_KEYS.items():
        assert auth.authenticate(key).id == tenant_id
    assert auth.is_admin(DEMO_ADMIN_KEY)


def test_default_yaml_holds_no_plaintext_key() -> None:
    text = Path("tenancy/default_tenants.yaml").read_text(encoding="utf-8")
    for key in [*DEMO_KEYS.values(), DEMO_ADMIN_KEY]:
        assert key not in text
        assert hash_api_key(key, DEMO_KEY_SALT) in text


def test_load_round_trip(tmp_path: Path) -> None:
    config = load_tenancy_config(write(tmp_path, config_data(tenant("acme", weight=3))))
    assert config.tenant("acme").weight == 3
    assert config.sla_class_of("acme").priority_tier == 1


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["tenants"][0].update(weight=0), "tenants.0.weight"),
        (lambda d: d["tenants"][0].update(sla_class="gold"), "tenants.0.sla_class"),
        (lambda d: d["tenants"][0]["quotas"].update(requests_per_minute=-1), "requests_per_minute"),
        (lambda d: d["tenants"][0]["quotas"].update(burst=3), "tenants.0.quotas.burst"),
        (lambda d: d["tenants"][0].update(api_key_hashes=["sk-plaintext"]), "tenants.0.api_key_hashes.0"),
        (lambda d: d["tenants"].append(tenant("a")), "tenants.2.id"),
        (
            lambda d: d["tenants"][1].update(api_key_hashes=d["tenants"][0]["api_key_hashes"]),
            "api_key_hashes",
        ),
        (lambda d: d["sla_classes"].append(dict(d["sla_classes"][0])), "sla_classes.3.name"),
        (lambda d: d.update(admin_key_hash=d["tenants"][0]["api_key_hashes"][0]), "admin_key_hash"),
        (lambda d: d["tenants"][0]["quotas"].update(max_tokens_per_request=5000), "max_tokens_per_request"),
        (lambda d: d.pop("admin_key_hash"), "admin_key_hash"),
        (lambda d: d.pop("key_salt"), "key_salt"),
        (lambda d: d.update(key_salt="short"), "key_salt: key_salt must be at least 16 characters"),
        (lambda d: d.update(extra_field=1), "extra_field"),
    ],
)
def test_invalid_config_names_the_field(tmp_path: Path, mutate, needle: str) -> None:
    data = config_data(tenant("a"), tenant("b"))
    mutate(data)
    with pytest.raises(TenancyConfigError) as info:
        load_tenancy_config(write(tmp_path, data))
    assert needle in str(info.value)


def test_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("gpu_dollars_per_hour: 1\ngpu_dollars_per_hour: 2\n", encoding="utf-8")
    with pytest.raises(TenancyConfigError, match="duplicate key 'gpu_dollars_per_hour'"):
        load_tenancy_config(path)


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(TenancyConfigError, match="cannot read"):
        load_tenancy_config(tmp_path / "nope.yaml")
    with pytest.raises(TenancyConfigError, match="must be a mapping"):
        parse_tenancy_config([1, 2])


def test_config_is_frozen() -> None:
    config = default_tenancy_config()
    with pytest.raises(ValueError, match="frozen"):
        config.tenants[0].weight = 5.0  # type: ignore[misc]


def test_every_field_is_described() -> None:
    from tenancy.config import FairShareSettings, Quotas, SLAClass, TenancyConfig, Tenant

    for model in (Quotas, Tenant, SLAClass, FairShareSettings, TenancyConfig):
        missing = [name for name, f in model.model_fields.items() if not f.description]
        assert missing == [], f"{model.__name__}: {missing}"
        assert model.model_config["extra"] == "forbid" and model.model_config["frozen"] is True
