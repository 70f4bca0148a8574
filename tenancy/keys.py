"""API-key hashing: keys are stored and compared only as HMAC-SHA256 digests under a secret salt.

A plain sha256 of a key can be reversed by a dictionary or precomputed table and matches the same
key in every deployment; an HMAC keyed by a per-deployment secret (``TenancyConfig.key_salt``)
cannot be checked without that secret, so a leaked hash file alone gives nothing away.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from tenancy.errors import KeySaltError

HASH_PREFIX = "hmac-sha256:"
KEY_HASH_PATTERN = r"^hmac-sha256:[0-9a-f]{64}$"
LEGACY_PREFIX = "sha256:"  # the unsalted form of earlier versions, refused by the config
MIN_SALT_LENGTH = 16
_KEY_HASH_RE = re.compile(KEY_HASH_PATTERN)


def check_salt(salt: str) -> str:
    """``salt`` when it is long enough to key the HMAC; ``KeySaltError`` otherwise."""
    if len(salt) < MIN_SALT_LENGTH:
        raise KeySaltError(f"key_salt must be at least {MIN_SALT_LENGTH} characters (got {len(salt)})")
    return salt


def hash_api_key(key: str, salt: str) -> str:
    """The stored form of an API key: ``"hmac-sha256:" + hex HMAC-SHA256(salt, key)`` (UTF-8)."""
    mac = hmac.new(check_salt(salt).encode("utf-8"), key.encode("utf-8"), hashlib.sha256)
    return HASH_PREFIX + mac.hexdigest()


def key_matches(key: str, stored_hash: str, salt: str) -> bool:
    """Constant-time check that ``key`` hashes to ``stored_hash`` under ``salt``."""
    return hmac.compare_digest(hash_api_key(key, salt).encode("ascii"), stored_hash.encode("ascii"))


def is_key_hash(value: str) -> bool:
    """Whether ``value`` has the stored form (used to avoid echoing hashes in error messages)."""
    return _KEY_HASH_RE.match(value) is not None
