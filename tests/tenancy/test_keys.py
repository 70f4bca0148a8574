"""API keys are stored as HMAC-SHA256 under a per-deployment salt; unsalted sha256 is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from tenancy import AuthenticationError, Authenticator, KeySaltError, TenancyConfigError, hash_api_key
from tenancy.keys import key_matches
from tenancy.loader import load_tenancy_config, read_key_salt
from tests.tenancy.helpers import ADMIN_KEY, SALT, config_data, make_config, tenant

KEY = "sk-test-alpha"
OTHER_SALT = "another-deployment-salt-42"


def test_stored_form_is_hmac_not_plain_sha256() -> None:
    stored = hash_api_key(KEY, SALT)
    assert stored.startswith("hmac-sha256:") and len(stored) == len("hmac-sha256:") + 64
    assert stored.removeprefix("hmac-sha256:") != hashlib.sha256(KEY.encode()).hexdigest()
    assert stored != hash_api_key(KEY, OTHER_SALT)
    assert stored == hash_api_key(KEY, SALT)  # deterministic: the O(1) lookup by digest relies on it
    assert key_matches(KEY, stored, SALT) and not key_matches(KEY, stored, OTHER_SALT)


def test_short_salt_is_refused_without_echoing_it() -> None:
    with pytest.raises(KeySaltError, match="at least 16") as info:
        hash_api_key(KEY, "tiny-salt")
    assert "tiny-salt" not in str(info.value)


def test_keys_hashed_under_another_salt_do_not_authenticate() -> None:
    data = config_data(tenant("a"))
    data["tenants"][0]["api_key_hashes"] = [hash_api_key(KEY, OTHER_SALT)]
    auth = Authenticator(make_config(*data["tenants"]))
    with pytest.raises(AuthenticationError):
        auth.authenticate(KEY)
    assert auth.is_admin(ADMIN_KEY) and not auth.is_admin(KEY)


@pytest.mark.parametrize("field", ["admin_key_hash", "tenants.0.api_key_hashes.0"])
def test_plain_sha256_hashes_are_refused_with_migration_advice(tmp_path: Path, field: str) -> None:
    data = config_data(tenant("a"))
    legacy = "sha256:" + hashlib.sha256(b"sk-test-a").hexdigest()
    if field == "admin_key_hash":
        data["admin_key_hash"] = legacy
    else:
        data["tenants"][0]["api_key_hashes"] = [legacy]
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(TenancyConfigError) as info:
        load_tenancy_config(path)
    message = str(info.value)
    assert f"{field}: plain 'sha256:' key hashes are no longer accepted" in message
    assert "fairlane hash-key" in message
    assert legacy not in message


def test_salt_never_shows_in_repr_or_json() -> None:
    config = make_config(tenant("a"))
    assert config.key_salt.get_secret_value() == SALT
    assert SALT not in repr(config) and SALT not in config.model_dump_json() and SALT not in str(config)


def test_read_key_salt_needs_no_valid_hashes(tmp_path: Path) -> None:
    """``fairlane hash-key`` reads the salt of a config whose hashes are still the old form."""
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"key_salt": SALT, "admin_key_hash": "sha256:" + "0" * 64}))
    assert read_key_salt(path) == SALT
    path.write_text(yaml.safe_dump({"admin_key_hash": "x"}))
    with pytest.raises(TenancyConfigError, match="no key_salt"):
        read_key_salt(path)
    path.write_text(yaml.safe_dump({"key_salt": "short"}))
    with pytest.raises(TenancyConfigError, match="at least 16"):
        read_key_salt(path)
