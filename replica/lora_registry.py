"""The adapters a replica serves, by name: read, checked and packed on registration.

Registration runs on the caller's thread (reading and packing an 8B-shape rank-16 adapter takes
about as long as reading its 84 MB); the engine's thread only looks adapters up, at admission.
A name is taken until it is removed: registering another adapter under it is refused (remove it
first), so a name means one set of weights while it is registered. Removal unregisters at once;
requests that already hold the adapter keep it and finish with it (a sequence refers to the
adapter itself, not to its name), and its slot is the first to be reused once they have.
"""

from __future__ import annotations

import threading

import torch

from replica.errors import AdapterError, UnknownAdapterError
from replica.lora_adapter import LoraAdapter, ModuleShapes, read_adapter
from replica.lora_layout import LoraLayout


class LoraRegistry:
    def __init__(self, layout: LoraLayout, dtype: torch.dtype, pin: bool) -> None:
        self.layout = layout
        self.dtype = dtype
        self.pin = pin  # pinned host images: the device copies them asynchronously
        self._lock = threading.Lock()
        self._by_name: dict[str, LoraAdapter] = {}

    @property
    def shapes(self) -> ModuleShapes:
        return self.layout.shapes

    def add(self, name: str, path: str) -> LoraAdapter:
        if not isinstance(name, str) or not name:
            raise AdapterError("an adapter needs a non-empty name")
        with self._lock:
            if name in self._by_name:
                raise AdapterError(f"adapter {name!r} is registered already; remove it first")
        adapter = read_adapter(name, path, self.shapes, self.layout.rank)
        adapter.packed = self.layout.pack(adapter, self.dtype, self.pin)
        # Only the image is read from now on (slot loads); the float32 matrices it was packed from
        # would double an adapter's host memory (160 MiB beside an 80 MiB image, 8B shape, rank 16:
        # 500 registered adapters would not fit a 128 GiB host).
        adapter.weights = {}
        with self._lock:
            if name in self._by_name:  # registered meanwhile by another caller
                raise AdapterError(f"adapter {name!r} is registered already; remove it first")
            self._by_name[name] = adapter
        return adapter

    def remove(self, name: str) -> None:
        with self._lock:
            adapter = self._by_name.pop(name, None)
        if adapter is None:
            raise UnknownAdapterError(f"no adapter named {name!r}")
        adapter.removed = True

    def get(self, name: str) -> LoraAdapter:
        adapter = self._by_name.get(name)
        if adapter is None:
            raise UnknownAdapterError(f"no adapter named {name!r}")
        return adapter

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._by_name)


def build_lora(cfg, model, device: torch.device, dtype: torch.dtype):
    """The registry and the device slots of an engine with `cfg.lora_slots` > 0, with the config's
    adapters registered (their errors stop the start); (None, None) with LoRA off."""
    from replica.lora_slots import LoraSlots

    if cfg.lora_slots == 0:
        return None, None
    layout = LoraLayout(ModuleShapes.of(model.config, model.head_dim), cfg.max_lora_rank)
    registry = LoraRegistry(layout, dtype, pin=device.type == "cuda")
    for name, path in cfg.lora_adapters:
        registry.add(name, path)
    slots = LoraSlots(layout, cfg.lora_slots, device, dtype, fence=lambda: None)  # the runner's, later
    return registry, slots
