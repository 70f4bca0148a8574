"""The slot pool's bookkeeping (hold, LRU eviction, waiting when every slot is held), the packed slot
image (the only host copy the registry keeps), and a step's adapter rows and tiles."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from replica.lora_adapter import LoraAdapter, ModuleShapes, read_adapter
from replica.lora_layout import LoraLayout
from replica.lora_registry import LoraRegistry
from replica.lora_slots import LoraSlots
from replica.lora_step import TILE_ROWS, fill_lora, max_tiles
from tests.lora_files import write_lora

SHAPES = ModuleShapes(2, {
    "q_proj": (8, 8), "k_proj": (8, 4), "v_proj": (8, 4), "o_proj": (8, 8),
    "gate_proj": (8, 16), "up_proj": (8, 16), "down_proj": (16, 8),
})  # fmt: skip


def _adapter(name: str, rank: int = 2, seed: int = 0) -> LoraAdapter:
    g = torch.Generator().manual_seed(seed)
    weights = {
        (layer, m): (torch.randn(rank, SHAPES.features[m][0], generator=g),
                     torch.randn(SHAPES.features[m][1], rank, generator=g))
        for layer in range(2) for m in ("k_proj", "up_proj")
    }  # fmt: skip
    return LoraAdapter(name, "/x", rank, 1.0, ("k_proj", "up_proj"), name, weights)


def _slots(n: int) -> LoraSlots:
    layout = LoraLayout(SHAPES, 4)
    return LoraSlots(layout, n, torch.device("cpu"), torch.float32, fence=lambda: None)


def _packed(slots: LoraSlots, adapter: LoraAdapter) -> LoraAdapter:
    adapter.packed = slots.layout.pack(adapter, torch.float32)
    return adapter


def test_pack_places_each_part_and_pads_with_zeros():
    layout = LoraLayout(SHAPES, 4)
    adapter = _adapter("a", rank=2)
    pool = layout.pack(adapter, torch.float32)[None]
    a, b = layout.views(pool, 1, "qkv_proj")
    k_a, k_b = adapter.weights[(1, "k_proj")]
    assert a.shape == (1, 12, 8) and b.shape == (1, 16, 4)
    assert torch.equal(a[0, 4:6], k_a) and not a[0, :4].any() and not a[0, 6:].any()
    assert torch.equal(b[0, 8:12, :2], k_b) and not b[0, :8].any() and not b[0, :, 2:].any()
    up_a, up_b = layout.views(pool, 0, "gate_up_proj")
    assert torch.equal(up_a[0, 4:6], adapter.weights[(0, "up_proj")][0])
    assert torch.equal(up_b[0, 16:, :2], adapter.weights[(0, "up_proj")][1])


def test_the_registry_keeps_only_the_slot_image(tmp_path) -> None:
    """One slot image per registered adapter (docs/engine.md): the float32 matrices it was packed
    from are let go, or 500 registered 8B-shape adapters would take 240 MiB each, not 80."""
    path = write_lora(tmp_path / "a", 2, SHAPES.features, rank=2, modules=("k_proj", "up_proj"))
    layout = LoraLayout(SHAPES, 4)
    adapter = LoraRegistry(layout, torch.float32, pin=False).add("a", str(path))
    assert adapter.weights == {} and adapter.packed.shape == (layout.total,)
    reference = layout.pack(read_adapter("a", str(path), SHAPES, 4), torch.float32)
    assert adapter.packed.any() and torch.equal(adapter.packed, reference)


def test_slots_load_hold_and_evict_least_recently_released():
    slots = _slots(2)
    a, b, c = (_packed(slots, _adapter(n, seed=i)) for i, n in enumerate("abc"))
    sa, sb = slots.acquire(a), slots.acquire(b)
    assert {sa, sb} == {0, 1} and slots.num_loads == 2
    assert slots.acquire(c) is None  # every slot held: c waits
    assert torch.equal(slots.pool[sa], a.packed)
    slots.release(sa)
    slots.release(sb)  # b released last: a is the least recently used
    assert slots.acquire(a) == sa and slots.num_loads == 2  # resident: no load
    slots.release(sa)
    sc = slots.acquire(c)
    assert sc == sb and slots.num_evictions == 1 and torch.equal(slots.pool[sc], c.packed)
    assert sorted(slots.resident()) == ["a", "c"]
    a.removed = True  # unregistered: gone from the resident list, its slot reused first
    assert slots.resident() == ["c"]
    assert slots.acquire(_packed(slots, _adapter("d"))) == sa


def _plan(slots: list[int], news: list[int]):
    items = [
        SimpleNamespace(seq=SimpleNamespace(lora_slot=s), num_new=n) for s, n in zip(slots, news, strict=True)
    ]
    return SimpleNamespace(items=items, num_tokens=sum(news))


def test_fill_groups_rows_by_slot_into_tiles():
    news = [1] * 20 + [30, 3]
    slot_of_item = [3, -1, 0] * 6 + [3, 3] + [0, -1]
    plan = _plan(slot_of_item, news)
    t = plan.num_tokens
    arrays = {
        "lora_slot": np.full(64, 7, np.int64), "lora_order": np.zeros(64, np.int32),
        **{f"lora_tile_{k}": np.full(max_tiles(64, 4), 9, np.int32) for k in ("slot", "start", "count")},
    }  # fmt: skip
    n = fill_lora(plan, arrays, padded_tokens=64)
    rows = np.repeat(slot_of_item, news)
    assert (arrays["lora_slot"][:t] == rows).all() and (arrays["lora_slot"][t:] == -1).all()
    counts = arrays["lora_tile_count"]
    assert counts[:n].min() >= 1 and counts[:n].max() <= TILE_ROWS and not counts[n:].any()
    covered = []
    for k in range(n):
        start, count, slot = arrays["lora_tile_start"][k], counts[k], arrays["lora_tile_slot"][k]
        members = arrays["lora_order"][start : start + count]
        assert (rows[members] == slot).all()
        covered.extend(members.tolist())
    assert sorted(covered) == np.flatnonzero(rows >= 0).tolist()  # every adapter row once, none else
    assert n <= max_tiles(t, 4)
