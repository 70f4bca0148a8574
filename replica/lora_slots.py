"""The device's adapter slots: a fixed pool, which adapter each slot holds, loads, and LRU eviction.

The pool is one tensor [slots, per-slot elements] (replica/lora_layout.py), allocated once at start,
so CUDA graphs read every adapter at fixed addresses and no step allocates adapter memory.

A sequence with an adapter holds its slot from admission to its end or preemption (`acquire` /
`release`, counted per slot; n > 1 forks hold it too). A slot no sequence holds is idle and stays
loaded; when an adapter that is not resident is asked for, the least recently released idle slot
(an empty one first) is loaded with it. When every slot is held, `acquire` answers None and the
request waits in the queue (the scheduler tries again each step) instead of failing.

Loads. On CUDA the copy from the adapter's pinned host image runs on a side stream, after the last
launched step's compute (a sequence that ended while that step was in flight may still be read
from an evicted slot), and records an event; the sequence is admitted only once the event has
completed (`acquire` queries it without waiting), so no step ever waits for a load and the steps
of other requests go on meanwhile. On the CPU the copy is a plain one and done at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from replica.lora_adapter import LoraAdapter
from replica.lora_layout import LoraLayout

Fence = Callable[[], object | None]  # the last launched step's compute-done event (None: none yet)


class LoraSlots:
    def __init__(
        self, layout: LoraLayout, num_slots: int, device: torch.device, dtype: torch.dtype, fence: Fence
    ) -> None:
        self.layout = layout
        self.num_slots = num_slots
        self.device = device
        self.dtype = dtype
        self.fence = fence
        self.pool = torch.zeros(num_slots, layout.total, dtype=dtype, device=device)
        self.owner: list[LoraAdapter | None] = [None] * num_slots
        self.users = [0] * num_slots
        self._slot_of: dict[int, int] = {}  # adapter uid -> its slot
        self._idle: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))  # LRU first
        self._loading: dict[int, object] = {}  # slot -> the event its load records
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.num_loads = 0
        self.num_evictions = 0

    # ---- the scheduler's side (engine thread) ----------------------------------------------------
    def acquire(self, adapter: LoraAdapter) -> int | None:
        """A slot that holds `adapter`, loaded, held for one more sequence; None: not yet (its load
        is under way, or every slot is held)."""
        slot = self._slot_of.get(adapter.uid)
        if slot is None:
            slot = self._victim()
            if slot is None:
                return None
            self._load(slot, adapter)
        if slot in self._loading and not self._settle(slot):
            return None
        self.hold(slot)
        return slot

    def hold(self, slot: int) -> None:
        """One more sequence reads `slot` (a fork of a sequence that holds it)."""
        self.users[slot] += 1
        self._idle.pop(slot, None)

    def release(self, slot: int) -> None:
        self.users[slot] -= 1
        if self.users[slot] == 0:
            self._idle[slot] = None  # most recently used: evicted last

    def resident(self) -> list[str]:
        """Names of the registered adapters in slots now (loaded or loading); any thread may ask."""
        return [a.name for a in list(self.owner) if a is not None and not a.removed]

    # ---- loads -----------------------------------------------------------------------------------
    def _victim(self) -> int | None:
        """The idle slot to load next: an empty one, else one of a removed adapter, else the least
        recently released."""
        for slot in list(self._loading):  # a finished load whose sequence went away: idle again
            if self.users[slot] == 0 and self._settle(slot):
                self._idle[slot] = None  # just loaded: the most recently used
        if not self._idle:
            return None
        gone = next((s for s in self._idle if self.owner[s] is None or self.owner[s].removed), None)
        slot = gone if gone is not None else next(iter(self._idle))
        old = self.owner[slot]
        if old is not None:
            del self._slot_of[old.uid]
            self.num_evictions += 1
        return slot

    def _load(self, slot: int, adapter: LoraAdapter) -> None:
        self._idle.pop(slot, None)
        self.owner[slot] = adapter
        self._slot_of[adapter.uid] = slot
        self.num_loads += 1
        if self._stream is None:
            self.pool[slot].copy_(adapter.packed)
            return
        fence = self.fence()
        with torch.cuda.stream(self._stream):
            if fence is not None:
                self._stream.wait_event(fence)
            self.pool[slot].copy_(adapter.packed, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        self._loading[slot] = done

    def _settle(self, slot: int) -> bool:
        """Whether `slot`'s load has finished (asked without waiting); forgets the event once it has."""
        if self._loading[slot].query():
            del self._loading[slot]
            return True
        return False
