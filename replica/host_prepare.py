"""Host time to prepare one decode step, measured alone: schedule + fill the IO buffers.

    python -m bench.engine_lockstep --modes prepare --batch 256 --prompt-len 256

Builds `num_seqs` running sequences (no model, no device work), then runs the steady decode cycle
the async loop runs: plan a step, fill its inputs, and read back the step before it (append one
token to each sequence). The engine's own profile reports the same two parts in situ, where the
engine thread also shares the interpreter with the callers' streams.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from replica.block_manager import BlockManager
from replica.io_buffers import StepBuffers
from replica.sampling_params import SamplingParams
from replica.scheduler import Scheduler, StepPlan
from replica.sequence import Sequence
from replica.step_inputs import FillContext, fill_step


def measure(
    num_seqs: int, prompt_len: int, steps: int = 500, block_size: int = 16, temperature: float = 0.0
) -> dict:
    """p50/p99 of schedule, fill and their sum over `steps` decode steps at `num_seqs` sequences
    (greedy, or sampled with top-p 0.9 at `temperature` > 0)."""
    max_len = prompt_len + steps + 64
    width = -(-max_len // block_size)
    blocks = BlockManager(num_seqs * width + 1, block_size)
    scheduler = Scheduler(blocks, num_seqs, max(4096, num_seqs), width)
    top_p = 0.9 if temperature > 0 else 1.0
    params = SamplingParams(max_tokens=steps + 16, temperature=temperature, top_p=top_p, ignore_eos=True)
    for i in range(num_seqs):
        prompt = list(range(100, 100 + prompt_len))
        scheduler.add(Sequence(str(i), prompt, prompt_len, params, i, 0.0, max_len))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    buffers = [StepBuffers(device, max(4096, num_seqs), num_seqs, width, 4096) for _ in (0, 1)]
    vocab = 128256
    ctx = FillContext(block_size, vocab, (num_seqs * vocab + np.arange(max(4096, num_seqs))).astype(np.int64))
    _run_prefill(scheduler, buffers[0], ctx)
    schedule_ms, fill_ms, previous = [], [], None
    for k in range(steps):
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        t1 = time.perf_counter()
        fill_step(plan, buffers[k % 2], ctx)
        t2 = time.perf_counter()
        if previous is not None:
            _read_back(previous)
        previous = plan
        schedule_ms.append((t1 - t0) * 1e3)
        fill_ms.append((t2 - t1) * 1e3)
    total = [a + b for a, b in zip(schedule_ms, fill_ms, strict=True)]
    return {
        "mode": "prepare",
        "num_seqs": num_seqs,
        "temperature": temperature,
        "steps": steps,
        "schedule_ms": _stats(schedule_ms),
        "fill_ms": _stats(fill_ms),
        "host_prepare_ms": _stats(total),
    }


def _run_prefill(scheduler: Scheduler, buffers: StepBuffers, ctx: FillContext) -> None:
    """Schedule the prompts until every sequence is decoding."""
    while True:
        plan = scheduler.schedule()
        fill_step(plan, buffers, ctx)
        _read_back(plan)
        if plan.num_tokens == len(plan.items) and not scheduler.waiting:
            return


def _read_back(plan: StepPlan) -> None:
    for seq in plan.sample_seqs:
        seq.num_pending -= 1
        seq.tokens.append(7)


def _stats(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": float(np.max(ordered)),
    }
