"""API-key hashing. Keys are stored and compared only as ``sha256:<hex>`` digests."""

from __future__ import annotations

import hashlib
import hmac

HASH_PREFIX = "sha256:"


def hash_api_key(key: str) -> str:
    """Return the stored form of an API key: ``"sha256:" + hex digest`` of its UTF-8 bytes."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_matches(key: str, stored_hash: str) -> bool:
    """Constant-time check that ``key`` hashes to ``stored_hash``."""
    return hmac.compare_digest(hash_api_key(key).encode("ascii"), stored_hash.encode("ascii"))
