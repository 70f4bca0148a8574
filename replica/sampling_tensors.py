"""The per-row sampling parameters of a step, on the device: what the CPU reference
(`sampler.py`) and the Triton sampler (`triton_sampler.py`) both read, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_CHAIN = 64  # checks before the chain stops at its latest link (never seen reached)


@dataclass
class SamplingTensors:
    """Per-row parameters of a step's sample rows, on the device."""

    temperature: torch.Tensor  # [S] float32, 0 = greedy
    top_k: torch.Tensor  # [S] int64, 0 = off (1 = greedy)
    top_p: torch.Tensor  # [S] float32, 1 = off
    min_p: torch.Tensor  # [S] float32, 0 = off
    seed: torch.Tensor  # [S] int64 (32-bit values)
    position: torch.Tensor  # [S] int64: index of the output token being drawn
