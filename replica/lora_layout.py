"""Where one adapter's weights sit in a slot: one flat buffer per slot, every matrix at a fixed offset.

Our module fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (replica/weights.py), so a
slot holds, per layer and fused module, A stacked over its parts [parts · R, in] (part j in rows
j·R … j·R + r) and B [out, R] (part j's output rows at the fused output's slice j, columns 0 … r),
R being the pool's max_lora_rank: lower ranks and untargeted parts are zeros, which add nothing.
The scaling is folded into B. One flat buffer per slot means that loading an adapter is one copy,
and the device pool [slots, total] gives each matrix as a strided view [slots, …] (slot stride =
total) that the kernels index by slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.lora_adapter import LoraAdapter, ModuleShapes

FUSED: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
PART_OF = {part: (fused, j) for fused, parts in FUSED.items() for j, part in enumerate(parts)}
_ALIGN = 64  # elements: every matrix starts 128-byte aligned in bf16


@dataclass(frozen=True)
class MatrixPlace:
    """One (layer, fused module)'s A and B in a slot's flat buffer."""

    a_offset: int
    a_shape: tuple[int, int]  # (parts · R, in)
    b_offset: int
    b_shape: tuple[int, int]  # (out, R)
    bounds: tuple[int, ...]  # the fused output's part slices: part j is bounds[j] … bounds[j + 1]


class LoraLayout:
    def __init__(self, shapes: ModuleShapes, max_rank: int) -> None:
        self.shapes = shapes
        self.rank = max_rank
        self.places: dict[tuple[int, str], MatrixPlace] = {}
        at = 0
        for layer in range(shapes.num_layers):
            for fused, parts in FUSED.items():
                fan_in = shapes.features[parts[0]][0]
                outs = [shapes.features[p][1] for p in parts]
                bounds = tuple(sum(outs[:j]) for j in range(len(parts) + 1))
                a_shape, b_shape = (len(parts) * max_rank, fan_in), (bounds[-1], max_rank)
                b_at = _aligned(at + a_shape[0] * a_shape[1])
                self.places[(layer, fused)] = MatrixPlace(at, a_shape, b_at, b_shape, bounds)
                at = _aligned(b_at + b_shape[0] * b_shape[1])
        self.total = at  # elements per slot

    def views(self, pool: torch.Tensor, layer: int, fused: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A [slots, parts · R, in] and B [slots, out, R] of one module, as views of the pool."""
        place = self.places[(layer, fused)]
        a = pool[:, place.a_offset : place.a_offset + place.a_shape[0] * place.a_shape[1]]
        b = pool[:, place.b_offset : place.b_offset + place.b_shape[0] * place.b_shape[1]]
        return a.unflatten(1, place.a_shape), b.unflatten(1, place.b_shape)

    def pack(self, adapter: LoraAdapter, dtype: torch.dtype, pin: bool = False) -> torch.Tensor:
        """The adapter's slot image: zeros but for its matrices, in `dtype` (pinned for fast loads)."""
        flat = torch.zeros(self.total, dtype=dtype, pin_memory=pin)
        for (layer, module), (a, b) in adapter.weights.items():
            fused, j = PART_OF[module]
            place = self.places[(layer, fused)]
            r = a.shape[0]
            a_view = flat[place.a_offset : place.a_offset + place.a_shape[0] * place.a_shape[1]]
            a_view.view(place.a_shape)[j * self.rank : j * self.rank + r].copy_(a)
            b_view = flat[place.b_offset : place.b_offset + place.b_shape[0] * place.b_shape[1]]
            b_view.view(place.b_shape)[place.bounds[j] : place.bounds[j + 1], :r].copy_(b)
        return flat

    def slot_bytes(self, dtype: torch.dtype) -> int:
        return self.total * torch.finfo(dtype).bits // 8


def _aligned(at: int) -> int:
    return -(-at // _ALIGN) * _ALIGN
