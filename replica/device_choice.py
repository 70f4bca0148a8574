"""The engine's device, dtype and loop mode from the config's names ("auto": what suits the device)."""

from __future__ import annotations

import torch

from replica.errors import InvalidRequestError


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device 'cuda' asked for, but CUDA is not available")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def resolve_mode(name: str, device: torch.device) -> str:
    """The step loop's mode: "auto" overlaps where a device computes apart from the host. On the CPU
    a step's forward runs inside its launch, so overlapping would only hand its tokens out a step late."""
    if name == "auto":
        return "async" if device.type == "cuda" else "sync"
    return name
