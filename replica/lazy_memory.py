"""Tensors that cost nothing until used: modules built without their default init, and CPU zeros
whose pages the kernel maps on first touch.

* **Modules.** ``nn.Linear`` and ``nn.Embedding`` fill their weights at construction (kaiming /
  normal draws), yet every parameter of the model is then written by the checkpoint or by
  ``init_random`` (replica/weights.py checks that none is left). ``UninitialisedLinear`` and
  ``UninitialisedEmbedding`` only allocate. (Building on the meta device instead pulled in
  torch._dynamo, 1.1 s, for the embedding's draw.)
* **CPU zeros.** ``torch.zeros`` writes every byte: a 32k-token CPU KV pool for SmolLM2 is 1.4 GB,
  all of it resident before the first request. ``lazy_zeros`` takes anonymous memory (``mmap``),
  which reads as zeros and is given pages as the pool is written, so an engine starts at once and
  holds only the blocks sequences have used. The pool stays zeros where unwritten: the reference
  attention masks padding with zero weights, and 0 x garbage could be NaN.

Together, SmolLM2's ``Engine.start()`` on the CPU with its default pool: 1.75 → 0.59 s and
2,370 → 928 MB resident (docs/engine.md, "Sizes").
"""

from __future__ import annotations

import math
import mmap

import torch
from torch import nn


class UninitialisedLinear(nn.Linear):
    """nn.Linear without its kaiming draw: the loader writes every parameter."""

    def reset_parameters(self) -> None:
        pass


class UninitialisedEmbedding(nn.Embedding):
    """nn.Embedding without its normal draw: the loader writes every parameter."""

    def reset_parameters(self) -> None:
        pass


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros of ``shape``: on the CPU backed by anonymous memory mapped on first touch, elsewhere
    ``torch.zeros`` (a device memset is cheap and CUDA memory is taken whole anyway)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, count * dtype.itemsize)  # the tensor keeps the mapping alive
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)
