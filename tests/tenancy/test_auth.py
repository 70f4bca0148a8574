from __future__ import annotations

import pytest

from tenancy import AuthenticationError, Authenticator, parse_bearer
from tests.tenancy.helpers import ADMIN_KEY, make_config, tenant


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(make_config(tenant("acme"), tenant("globex")))


def test_known_key_maps_to_tenant(auth: Authenticator) -> None:
    assert auth.authenticate("sk-test-acme").id == "acme"
    assert auth.authenticate("sk-test-globex").id == "globex"


@pytest.mark.parametrize(("key", "reason"), [(None, "missing"), ("", "missing"), ("sk-nope", "invalid")])
def test_bad_keys_are_refused(auth: Authenticator, key: str | None, reason: str) -> None:
    with pytest.raises(AuthenticationError) as info:
        auth.authenticate(key)
    assert info.value.reason == reason
    assert info.value.status_code == 401


def test_error_never_contains_the_key(auth: Authenticator) -> None:
    with pytest.raises(AuthenticationError) as info:
        auth.authenticate("sk-secret-value-123")
    assert "sk-secret-value-123" not in str(info.value)


def test_admin_key_is_not_a_tenant_key(auth: Authenticator) -> None:
    assert auth.is_admin(ADMIN_KEY)
    assert not auth.is_admin("sk-test-acme")
    assert not auth.is_admin(None)
    with pytest.raises(AuthenticationError):
        auth.authenticate(ADMIN_KEY)


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer sk-1", "sk-1"),
        ("bearer  sk-2 ", "sk-2"),
        ("Basic abc", None),
        (None, None),
        ("Bearer ", None),
    ],
)
def test_parse_bearer(header: str | None, key: str | None) -> None:
    assert parse_bearer(header) == key
