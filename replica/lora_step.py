"""A step's adapter rows on the host: each token row's slot, and the rows grouped by slot into tiles.

Written into the step's IO buffers (replica/io_buffers.py, fields `lora_*`), so they reach the device
in the step's one input copy and CUDA graphs read them at fixed addresses: one graph serves any mix
of adapters (there is no graph per adapter count).

- `lora_slot[t]`: token row t's slot, -1 without an adapter (padding rows too);
- `lora_order`: the rows that have an adapter, sorted by slot (stable);
- tiles: runs of at most TILE_ROWS consecutive entries of `lora_order` with one slot (slot, start
  in `lora_order`, count); the entries past the step's tiles have count 0 and do nothing. The
  kernels (replica/lora_triton.py) run one program per tile, so each adapter's matrices are read
  once per tile — once per step for up to TILE_ROWS rows of it — and rows without an adapter cost
  nothing.
"""

from __future__ import annotations

import numpy as np

TILE_ROWS = 16  # rows of one adapter a kernel program takes (the smallest tl.dot height)


def max_tiles(tokens: int, num_slots: int) -> int:
    """Tiles a step of `tokens` rows can need: a partial tile per slot at most, full ones besides."""
    return -(-tokens // TILE_ROWS) + min(tokens, num_slots)


def buffer_rows(max_rows: int, num_slots: int) -> dict[str, int]:
    """Sizes of the IO fields (all 0 with LoRA off: no bytes, no copies)."""
    if num_slots == 0:
        return {"lora_tokens": 0, "lora_tiles": 0}
    return {"lora_tokens": max_rows, "lora_tiles": max_tiles(max_rows, num_slots)}


def token_slots(plan) -> np.ndarray:
    """Each token row's slot: decode items one row each, then each chunk's rows."""
    slots = [item.seq.lora_slot for item in plan.items]
    if plan.num_tokens == len(plan.items):
        return np.asarray(slots, dtype=np.int64)
    return np.repeat(np.asarray(slots, dtype=np.int64), [item.num_new for item in plan.items])


def fill_lora(plan, arrays: dict[str, np.ndarray], padded_tokens: int) -> int:
    """Write the step's slots (padding rows to `padded_tokens` get -1), order and tiles; the number
    of tiles used."""
    slots = token_slots(plan)
    t = len(slots)
    arrays["lora_slot"][:t] = slots
    arrays["lora_slot"][t:padded_tokens] = -1
    order = np.argsort(slots, kind="stable")
    first = int(np.searchsorted(slots[order], 0))  # rows with -1 sort first: skipped
    order = order[first:]
    arrays["lora_order"][: len(order)] = order
    counts = arrays["lora_tile_count"]
    counts[:] = 0
    if not len(order):
        return 0
    ordered = slots[order]
    bounds = np.flatnonzero(np.diff(ordered)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(order)]))
    tile_starts = np.concatenate([np.arange(s, e, TILE_ROWS) for s, e in zip(starts, ends, strict=True)])
    seg_ends = np.repeat(ends, -(-(ends - starts) // TILE_ROWS))
    n = len(tile_starts)
    arrays["lora_tile_start"][:n] = tile_starts
    counts[:n] = np.minimum(seg_ends - tile_starts, TILE_ROWS)
    arrays["lora_tile_slot"][:n] = ordered[tile_starts]
    return n
