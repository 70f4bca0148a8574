"""Keys of automatic prefix caching: a hash chain over full KV blocks, rooted in what else shapes the KV.

A full block's key is H(previous block's key, its tokens), and the chain's root is H(model, scope):
the same tokens under another model, tenant scope or salt never share a key, so a lookup can only
find blocks its own scope wrote (no cross-tenant hits, hence no cross-tenant timing either).
blake2b, not Python's `hash`: a tenant must not be able to craft a collision with another tenant's
chain, and 128 bits keep accidental ones out of reach as well.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

DIGEST_BYTES = 16


def chain_root(model: str, scope: str) -> bytes:
    """The first link: the model (its name and weights seed stand for its weights) and the scope (the
    router's tenant or cache group and the request's cache_salt, opaque here)."""
    text = json.dumps(["fairlane-prefix-v1", model, scope])
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).digest()


def extend_chain(
    hashes: list[bytes], root: bytes, tokens: list[int], block_size: int, num_blocks: int
) -> None:
    """Append the keys of full blocks len(hashes) .. num_blocks - 1 of `tokens` to `hashes` (kept on
    the sequence, so each block is hashed once however often the scheduler looks)."""
    prev = hashes[-1] if hashes else root
    for i in range(len(hashes), num_blocks):
        block = np.asarray(tokens[i * block_size : (i + 1) * block_size], dtype=np.int64)
        prev = hashlib.blake2b(prev + block.tobytes(), digest_size=DIGEST_BYTES).digest()
        hashes.append(prev)
