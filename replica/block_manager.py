"""Paged KV cache bookkeeping: fixed-size blocks, a free list, per-sequence block tables.

Block 0 is reserved and never handed out: padded rows (CUDA graph batches) write their keys there,
so a padded row can never corrupt a live sequence's cache. Blocks are reference-counted: the
parallel samples of one request share their prompt's full blocks, and a block returns to the free
list when its last table lets go of it.

Prefix caching: a full block whose keys and values are written can be *registered* under its
hash-chain key (replica/prefix_cache.py). A registered block that no table holds any more stays
indexed on a second free list, in the order it was freed: a lookup can take it back (its count
goes up from 0), and it is evicted (unindexed) only when an allocation finds no plain free block,
least recently freed first. A block some table holds is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class BlockManager:
    """Hands out KV blocks. The scheduler asks `can_allocate` before it calls `allocate`."""

    NULL_BLOCK = 0

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(1, num_blocks))
        self._refs = [0] * num_blocks
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # registered, unheld: LRU first
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached(self) -> int:
        """Registered blocks (held or not): what a lookup can find."""
        return len(self._block_of)

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_used(self) -> int:
        return self.num_usable - self.num_free

    def blocks_needed(self, table: list[int], num_tokens: int) -> int:
        """Blocks to add to `table` so that it holds `num_tokens` tokens."""
        want = -(-num_tokens // self.block_size)
        return max(0, want - len(table))

    def can_allocate(self, count: int) -> bool:
        return count <= self.num_free

    def allocate(self, table: list[int], num_tokens: int) -> None:
        """Grow `table` in place to hold `num_tokens` tokens. The caller checked `can_allocate`."""
        count = self.blocks_needed(table, num_tokens)
        if count > self.num_free:
            raise RuntimeError(f"KV cache exhausted: need {count} blocks, {self.num_free} free")
        for _ in range(count):
            block = self._free.popleft() if self._free else self._evict()
            self._refs[block] = 1
            table.append(block)

    def _evict(self) -> int:
        """The least recently freed registered block, unindexed for reuse."""
        block, _ = self._cached_free.popitem(last=False)
        del self._block_of[self._key_of.pop(block)]
        self.num_evictions += 1
        return block

    def share(self, blocks: list[int]) -> list[int]:
        """A new table holding the same blocks (each one's count goes up)."""
        for block in blocks:
            self._refs[block] += 1
        return list(blocks)

    def free(self, table: list[int], forget: bool = False) -> None:
        """Let go of every block of `table` and empty it; blocks no other table holds are free again
        (registered ones stay findable until evicted). `forget`: the contents are not to be trusted
        (the step that wrote them failed), so the blocks are unindexed first."""
        for block in table:
            if forget and block in self._key_of:
                del self._block_of[self._key_of.pop(block)]
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key_of:
                    self._cached_free[block] = None  # most recently freed: evicted last
                else:
                    self._free.append(block)
        table.clear()

    # ---- prefix caching ------------------------------------------------------------------------
    def register(self, block: int, key: bytes) -> None:
        """Index a held, full, written block under its chain key. A block indexed already, or a key
        another block holds (two sequences computed the same prefix at once), is left as it is."""
        if block in self._key_of or key in self._block_of:
            return
        self._key_of[block] = key
        self._block_of[key] = block

    def cached_keys(self) -> list[bytes]:
        """Every registered key, for the replica's cache summary. Read from another thread: list() of
        a dict of bytes runs without releasing the GIL, so it sees the index between two changes."""
        return list(self._block_of)

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The blocks of the longest run of `keys` that is indexed, from the first."""
        found = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def unheld(self, blocks: list[int]) -> int:
        """How many of `blocks` sit on the free list: taking them uses up free blocks too."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def take(self, blocks: list[int]) -> list[int]:
        """Hold found blocks for a new table (off the free list where no table held them)."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._cached_free[block]
            self._refs[block] += 1
        return list(blocks)
