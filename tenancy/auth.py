"""API-key authentication: key -> tenant, against stored HMAC-SHA256 hashes (keyed by the config's salt)."""

from __future__ import annotations

import hmac

from tenancy.config import TenancyConfig, Tenant
from tenancy.errors import AuthenticationError
from tenancy.keys import HASH_PREFIX, hash_api_key

_BEARER = "bearer "
_DECOY = HASH_PREFIX + "0" * 64  # compared against when no stored hash matches, to keep timing flat


def parse_bearer(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header value, or None when absent or malformed."""
    if not authorization or authorization[: len(_BEARER)].lower() != _BEARER:
        return None
    key = authorization[len(_BEARER) :].strip()
    return key or None


class Authenticator:
    """Maps API keys to tenants.

    The presented key is HMAC'd under the deployment's salt first; the digest indexes a table of
    stored digests (O(1)) and the candidate is confirmed with ``hmac.compare_digest``. Timing can at
    most reveal something about the *HMAC* of the presented key, never about a stored key, and the
    plaintext is never kept.
    """

    def __init__(self, config: TenancyConfig) -> None:
        self._salt = config.key_salt.get_secret_value()
        self._by_hash: dict[str, Tenant] = {h: t for t in config.tenants for h in t.api_key_hashes}
        self._admin_hash = config.admin_key_hash
        self._metrics_hash = config.metrics_key_hash or _DECOY

    def authenticate(self, key: str | None) -> Tenant:
        """The tenant owning ``key``; ``AuthenticationError`` for a missing or unknown key."""
        if not key:
            raise AuthenticationError("missing")
        digest = hash_api_key(key, self._salt)
        tenant = self._by_hash.get(digest)
        stored = tenant.api_key_hashes[tenant.api_key_hashes.index(digest)] if tenant else _DECOY
        if not hmac.compare_digest(digest.encode("ascii"), stored.encode("ascii")) or tenant is None:
            raise AuthenticationError("invalid")
        return tenant

    def is_admin(self, key: str | None) -> bool:
        """Whether ``key`` is the admin key (constant-time comparison of hashes)."""
        return self._matches(key, self._admin_hash)

    def may_read_metrics(self, key: str | None) -> bool:
        """Whether ``key`` may read the metrics: the metrics key, or the admin key."""
        return self._matches(key, self._metrics_hash) or self.is_admin(key)

    def _matches(self, key: str | None, stored: str) -> bool:
        if not key:
            return False
        digest = hash_api_key(key, self._salt)
        return hmac.compare_digest(digest.encode("ascii"), stored.encode("ascii"))
