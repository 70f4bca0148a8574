"""The three streams of a step (H2D, compute, D2H) and the events that order them.

On CUDA these are real non-default streams and timing events. On the CPU the same calls are
no-ops around synchronous work and the events read the host clock, so the engine's loop and its
profiler run unchanged in CI.
"""

from __future__ import annotations

import contextlib
import time

import torch


class HostEvent:
    """A CPU stand-in for torch.cuda.Event: records the host clock."""

    def __init__(self) -> None:
        self.at = 0.0

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.at - self.at) * 1000.0


class StepStreams:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.h2d = torch.cuda.Stream(device)
            self.compute = torch.cuda.Stream(device)
            self.d2h = torch.cuda.Stream(device)

    def event(self):
        return torch.cuda.Event(enable_timing=True) if self.is_cuda else HostEvent()

    def on(self, name: str):
        """Context that makes stream `name` current (nothing on the CPU)."""
        if not self.is_cuda:
            return contextlib.nullcontext()
        return torch.cuda.stream(getattr(self, name))

    def wait(self, name: str, event) -> None:
        """Make stream `name` wait for `event` without blocking the host."""
        if self.is_cuda:
            getattr(self, name).wait_event(event)
