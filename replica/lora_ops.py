"""Batched LoRA in the forward: after each targeted projection, every token row gets its adapter's
`x · Aᵀ · Bᵀ` added (rows without one get nothing).

With LoRA on, the runner wraps the four fused projections of every layer (`qkv_proj`, `o_proj`,
`gate_up_proj`, `down_proj`) in `LoraLinear`: the base projection, then the delta from the slot pool
(replica/lora_slots.py), so the Llama module's eager and fused paths need no change. (The fused
path's K-slice partials of o/down take the weight directly and would skip the delta: the runner
turns them off with LoRA on, see model_runner.) Which slot each row uses comes from the step's IO
buffers through `LoraBatch`, bound before each forward (graph bodies included), so a captured graph
reads whatever mix the step holds.

On CUDA the delta is two Triton kernels per module (replica/lora_triton.py): the shrink reads only
the projection's input, so it runs on a side stream beside the base projection (in graphs too: a
fork and a join), and only the expand, which adds into the base output, follows it on the step's
stream. Elsewhere, and as the tests' reference, `lora_reference`: per slot present, a gather of its
rows and two matmuls.
"""

from __future__ import annotations

import torch
from torch import nn

from replica.lora_layout import FUSED
from replica.lora_slots import LoraSlots
from replica.lora_step import max_tiles
from replica.lora_triton import lora_expand, lora_shrink, lora_shrink_expand, shrink_buffer


class LoraBatch:
    """The current step's adapter rows, as views of its IO set's device buffers."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slot: torch.Tensor | None = None  # [tokens] int64, -1: no adapter
        self.order: torch.Tensor | None = None  # see replica/lora_step.py
        self.tiles: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.num_tiles = 0  # the kernels' grid: every tile the step's size can need
        self._side: torch.cuda.Stream | None = None  # the shrinks' stream, made on first CUDA use

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(device)
        return self._side

    def bind(self, dev: dict[str, torch.Tensor], tokens: int) -> None:
        self.slot = dev["lora_slot"][:tokens]
        self.order = dev["lora_order"]
        self.num_tiles = max_tiles(tokens, self.num_slots)
        names = ("lora_tile_slot", "lora_tile_start", "lora_tile_count")
        self.tiles = tuple(dev[name][: self.num_tiles] for name in names)


class LoraLinear(nn.Module):
    """A base projection plus the batched LoRA delta of its parts (q/k/v, gate/up, or one)."""

    def __init__(
        self, base: nn.Module, a: torch.Tensor, b: torch.Tensor, bounds: tuple[int, ...], batch: LoraBatch
    ) -> None:
        super().__init__()
        self.base = base
        self.lora_a, self.lora_b, self.bounds, self.batch = a, b, bounds, batch

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda or self.batch.slot is None:
            out = self.base(x)
            add_lora(out, x, self.lora_a, self.lora_b, self.bounds, self.batch)
            return out
        return self._overlapped(x)

    def _overlapped(self, x: torch.Tensor) -> torch.Tensor:
        """The base projection on the step's stream while the shrink runs on the side stream; the
        expand once both are done. The partials are allocated on the step's stream, which uses and
        frees them after the join, so the allocator never hands them to another stream early."""
        batch, main = self.batch, torch.cuda.current_stream(x.device)
        partials = shrink_buffer(x, self.lora_a)
        side = batch.side_stream(x.device)
        side.wait_stream(main)  # x is written
        with torch.cuda.stream(side):
            lora_shrink(partials, x, self.lora_a, batch.order, batch.tiles, batch.num_tiles)
        out = self.base(x)
        main.wait_stream(side)
        lora_expand(out, partials, self.lora_b, self.bounds, batch.order, batch.tiles, batch.num_tiles)
        return out


def attach_lora(model: nn.Module, slots: LoraSlots) -> LoraBatch:
    """Wrap every layer's fused projections; the LoraBatch the runner binds each step's rows to."""
    batch = LoraBatch(slots.num_slots)
    for i, layer in enumerate(model.layers):
        for fused in FUSED:
            parent = layer.self_attn if fused in ("qkv_proj", "o_proj") else layer.mlp
            a, b = slots.layout.views(slots.pool, i, fused)
            bounds = slots.layout.places[(i, fused)].bounds
            setattr(parent, fused, LoraLinear(getattr(parent, fused), a, b, bounds, batch))
    return batch


def add_lora(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bounds: tuple[int, ...], batch
) -> None:
    """out[t] += (x[t] · A[s]ᵀ) · B[s]ᵀ per part, s = row t's slot (in place)."""
    if batch.slot is None:
        return
    if out.is_cuda:
        lora_shrink_expand(out, x, a, b, bounds, batch.order, batch.tiles, batch.num_tiles)
        return
    lora_reference(out, x, a, b, bounds, batch.slot[: x.shape[0]])


def lora_reference(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bounds: tuple, slot: torch.Tensor
) -> None:
    """The plain torch delta: per slot present, its rows' two products (reads the slots on the host)."""
    rank = b.shape[2]
    for s in slot.unique().tolist():
        if s < 0:
            continue
        rows = (slot == s).nonzero()[:, 0]
        shrunk = x[rows] @ a[s].t()  # [rows, parts · R]
        delta = torch.empty(len(rows), out.shape[1], dtype=out.dtype, device=out.device)
        for j in range(len(bounds) - 1):
            part = slice(bounds[j], bounds[j + 1])
            delta[:, part] = shrunk[:, j * rank : (j + 1) * rank] @ b[s, part].t()
        out.index_add_(0, rows, delta)
