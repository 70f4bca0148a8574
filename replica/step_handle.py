"""What a launched step hands the engine: its plan, buffers and events, then its results on the host."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from replica.scheduler import StepPlan
from replica.step_sampler import PromptScores


@dataclass
class StepHandle:
    plan: StepPlan
    set_index: int
    num_samples: int
    prepare_ms: float
    graphed: bool
    events: dict  # start, h2d_done, compute_start, compute_done, d2h_done
    prev_compute_done: object | None  # the previous step's compute_done: the gap since is device idle
    kind: str = "greedy"
    prompt_scores: list[PromptScores] = field(default_factory=list)  # host copies after D2H
    launch_ms: float = 0.0  # host time to enqueue the step's copies, forward and sampling
    idle_ms: float = 0.0  # host time the loop waited for work before launching this step
    schedule_ms: float = 0.0  # host time the scheduler took to plan this step
    hold_ms: float = 0.0  # host time the loop held this step's plan back for arrivals
    began_at: float = 0.0  # host clock (perf_counter) when the loop began planning this step
    device_start: float | None = None  # host clock when the device began it, as best known
    masked_rows: int = 0  # grammar-constrained rows (a split step)
    read_early: bool = False  # the previous step was read back inside this one's launch

    def timings_ms(self) -> dict[str, float]:
        ev = self.events
        gap = 0.0
        if self.prev_compute_done is not None:
            gap = max(0.0, self.prev_compute_done.elapsed_time(ev["compute_start"]))
        return {
            "prepare_ms": self.prepare_ms,
            "launch_ms": self.launch_ms,
            "h2d_ms": ev["start"].elapsed_time(ev["h2d_done"]),
            "compute_ms": ev["compute_start"].elapsed_time(ev["compute_done"]),
            "d2h_ms": ev["compute_done"].elapsed_time(ev["d2h_done"]),
            "gap_ms": gap,
        }


@dataclass
class StepResult:
    """A step's outputs on the host: sampled ids, and logprob arrays in logprob steps."""

    tokens: np.ndarray
    logprob: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None
    prompt_scores: list[PromptScores] = field(default_factory=list)


def prompt_scores_to_host(scores: PromptScores, device: torch.device) -> PromptScores:
    """Enqueue a chunk's prompt logprobs into pinned host memory (on the current, D2H, stream)."""
    if device.type != "cuda":
        return scores
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (scores.logprob, scores.top_ids)]
    pinned.append(torch.empty(scores.top_logprobs.shape, dtype=torch.float32, pin_memory=True))
    for dst, src in zip(pinned, (scores.logprob, scores.top_ids, scores.top_logprobs), strict=True):
        dst.copy_(src, non_blocking=True)
        src.record_stream(torch.cuda.current_stream())  # made on the compute stream, read here
    return PromptScores(scores.chunk, *pinned)
