"""The Redis password comes from the environment (the Helm chart's Secret), never from the URL in config."""

from __future__ import annotations

import pytest

from cluster.routing.router_core import redis_url_with_password


@pytest.mark.parametrize(
    ("url", "password", "expected"),
    [
        ("redis://r.svc:6379/1", "s3cr@t/", "redis://:s3cr%40t%2F@r.svc:6379/1"),
        ("redis://r.svc:6379/1", None, "redis://r.svc:6379/1"),
        ("redis://:given@r.svc:6379/1", "other", "redis://:given@r.svc:6379/1"),
    ],
)
def test_password_from_environment(monkeypatch, url: str, password: str | None, expected: str) -> None:
    if password is None:
        monkeypatch.delenv("FAIRLANE_REDIS_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("FAIRLANE_REDIS_PASSWORD", password)
    assert redis_url_with_password(url) == expected
