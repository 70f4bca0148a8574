"""A replica's prefix cache in a few kilobytes: a Bloom filter over its registered block keys.

The routers steer a conversation's next turn to the replica that holds its prefix, so they need to
know, for a prompt's hash chain (``prefix_cache.extend_chain``), how many leading blocks a replica
has. The full key set is too large to ship every half second (an 8B replica on an H200 holds
54,067 blocks: 865 KB of 16-byte keys), so the replica ships a Bloom filter over the keys instead:
``BITS_PER_KEY`` bits per key (0.8 % false positives with ``NUM_PROBES`` probes), 66 KB at that
size, and never more than ``MAX_BYTES`` (more keys then raise the false-positive rate, they do not
grow the message). A false positive only makes a router overestimate one replica's hit by a block;
the engine's own lookup is exact.

The probes come from the keys themselves (they are blake2b digests, uniform already): the low and
high 8 bytes give two values h1, h2 and probe i is ``(h1 + i·h2) mod m`` (double hashing). numpy
builds a 54,067-key filter in about 15 ms (the replica rebuilds it at most twice a second).
Imports numpy and the standard library only: the routers read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BITS_PER_KEY = 10
NUM_PROBES = 7
MAX_BYTES = 96 * 1024
MIN_BITS = 512


@dataclass(frozen=True, slots=True)
class CacheSummary:
    """What a replica reports: the filter, its size in bits, and what the routers need to hash a
    prompt as the engine does (the chain's model key and block size)."""

    bits: bytes
    num_bits: int
    num_keys: int
    model_key: str
    block_size: int

    def as_dict(self) -> dict:
        return {
            "bits": self.bits,
            "num_bits": self.num_bits,
            "num_keys": self.num_keys,
            "model_key": self.model_key,
            "block_size": self.block_size,
        }

    @classmethod
    def from_dict(cls, data: dict) -> CacheSummary:
        return cls(
            bytes(data["bits"]),
            int(data["num_bits"]),
            int(data["num_keys"]),
            str(data["model_key"]),
            int(data["block_size"]),
        )


def _halves(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """h1, h2 per key (uint64); h2 is odd so the probes of one key never all coincide."""
    raw = np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2)  # 16-byte digests (DIGEST_BYTES)
    return raw[:, 0], raw[:, 1] | np.uint64(1)


def probe_positions(keys: list[bytes], num_bits: int) -> np.ndarray:
    """(len(keys), NUM_PROBES) bit positions of each key in a filter of ``num_bits`` bits."""
    if not keys:
        return np.zeros((0, NUM_PROBES), dtype=np.uint64)
    h1, h2 = _halves(keys)
    steps = np.arange(NUM_PROBES, dtype=np.uint64)
    with np.errstate(over="ignore"):  # uint64 wraps: that is the arithmetic meant
        return (h1[:, None] + steps[None, :] * h2[:, None]) % np.uint64(num_bits)


def filter_bits(num_keys: int, max_bytes: int = MAX_BYTES) -> int:
    """The filter's size for ``num_keys`` keys: BITS_PER_KEY each, a multiple of 8, within bounds."""
    wanted = max(MIN_BITS, num_keys * BITS_PER_KEY)
    return min(-(-wanted // 8) * 8, max_bytes * 8)


def build_summary(
    keys: list[bytes], model_key: str, block_size: int, max_bytes: int = MAX_BYTES
) -> CacheSummary:
    """The filter over ``keys`` (a replica's registered block keys)."""
    num_bits = filter_bits(len(keys), max_bytes)
    flags = np.zeros(num_bits, dtype=bool)
    flags[probe_positions(keys, num_bits).ravel().astype(np.int64)] = True
    bits = np.packbits(flags, bitorder="little").tobytes()
    return CacheSummary(bits, num_bits, len(keys), model_key, block_size)


class SummaryReader:
    """A received summary, unpacked once, answering "how many leading blocks of this chain?"."""

    def __init__(self, summary: CacheSummary) -> None:
        self.summary = summary
        packed = np.frombuffer(summary.bits, dtype=np.uint8)
        self._flags = np.unpackbits(packed, bitorder="little").astype(bool)

    def leading_blocks(self, chain: list[bytes]) -> int:
        """Blocks of ``chain`` present from the first (the engine's lookup stops at the first miss)."""
        if not chain or self.summary.num_keys == 0:
            return 0
        if not self._has(chain[0]):  # most replicas hold nothing of a given prefix: one probe set
            return 0
        present = self._flags[probe_positions(chain, self.summary.num_bits).astype(np.int64)].all(axis=1)
        misses = np.flatnonzero(~present)
        return int(misses[0]) if misses.size else len(chain)

    def _has(self, key: bytes) -> bool:
        """One key, in plain Python on the packed bits: a router asks this of every replica per
        request, and numpy's per-call overhead would cost more than the probes."""
        h1 = int.from_bytes(key[:8], "little")
        h2 = int.from_bytes(key[8:16], "little") | 1
        bits, m = self.summary.bits, self.summary.num_bits
        for i in range(NUM_PROBES):
            pos = ((h1 + i * h2) & 0xFFFFFFFFFFFFFFFF) % m  # the uint64 arithmetic of probe_positions
            if not (bits[pos >> 3] >> (pos & 7)) & 1:
                return False
        return True
