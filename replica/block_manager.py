"""Paged KV cache bookkeeping: fixed-size blocks, a free list, per-sequence block tables.

Block 0 is reserved and never handed out: padded rows (CUDA graph batches) write their keys there,
so a padded row can never corrupt a live sequence's cache. Blocks are reference-counted: the
parallel samples of one request share their prompt's full blocks, and a block returns to the free
list when its last table lets go of it.
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    """Hands out KV blocks. The scheduler asks `can_allocate` before it calls `allocate`."""

    NULL_BLOCK = 0

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(1, num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

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
        return count <= len(self._free)

    def allocate(self, table: list[int], num_tokens: int) -> None:
        """Grow `table` in place to hold `num_tokens` tokens. The caller checked `can_allocate`."""
        count = self.blocks_needed(table, num_tokens)
        if count > len(self._free):
            raise RuntimeError(f"KV cache exhausted: need {count} blocks, {len(self._free)} free")
        for _ in range(count):
            block = self._free.popleft()
            self._refs[block] = 1
            table.append(block)

    def share(self, blocks: list[int]) -> list[int]:
        """A new table holding the same blocks (each one's count goes up)."""
        for block in blocks:
            self._refs[block] += 1
        return list(blocks)

    def free(self, table: list[int]) -> None:
        """Let go of every block of `table` and empty it; blocks no other table holds are free again."""
        for block in table:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
        table.clear()
