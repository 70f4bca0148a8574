"""Per-step timing records and their summary (what `fairlane profile` prints)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass

FIELDS = (
    "schedule_ms", "prepare_ms", "launch_ms", "h2d_ms", "compute_ms", "d2h_ms", "gap_ms",
    "postprocess_ms", "wait_ms", "idle_ms", "hold_ms",
)  # fmt: skip


@dataclass
class StepRecord:
    step_id: int
    at: float  # host clock when the step's tokens were processed
    batch_size: int
    num_tokens: int  # tokens computed (prefill + decode)
    num_prefill_tokens: int
    num_sampled: int
    context_tokens: int  # tokens of context the step's attention reads, summed over its sequences
    schedule_ms: float  # host: pick the step's sequences and claim their cache slots
    prepare_ms: float  # host: build the step's inputs
    launch_ms: float  # host: enqueue the step's device work (eager steps: one call per kernel)
    h2d_ms: float
    compute_ms: float  # device: forward + sampling (CUDA events; host clock on CPU)
    d2h_ms: float
    gap_ms: float  # device idle between the previous step's compute and this one's
    postprocess_ms: float  # host: append tokens, stops, deliver outputs
    wait_ms: float  # host blocked on the step's D2H event
    idle_ms: float  # loop waited for work before this step
    hold_ms: float = 0.0  # loop waited on purpose for arrivals to join this step (replica/late_launch.py)
    kind: str = "greedy"  # greedy | sample | logprobs (replica/model_runner.py)
    graphed: bool = False  # replayed a CUDA graph
    masked_rows: int = 0  # grammar-constrained rows: the step ran split (forward, masks, draw)
    read_early: bool = False  # its masks waited for the previous step's tokens inside its launch


KINDS = ("greedy", "sample", "logprobs")  # logprobs: a sample step where some row asked


def _graphed_share(records: list[StepRecord]) -> float | None:
    return sum(r.graphed for r in records) / len(records) if records else None


def busy_fraction(records: list[StepRecord]) -> float | None:
    """Device compute time over compute plus the idle gaps before each step (None without records)."""
    busy = sum(r.compute_ms for r in records)
    idle = sum(r.gap_ms for r in records)
    return busy / (busy + idle) if busy + idle > 0 else None


PACE_FIELDS = ("steps", "decode_rows", "prefill_tokens", "context_tokens", "period_s")
BACK_TO_BACK_IDLE_MS = 1.0  # a step the loop waited longer for work before is not paced


def step_pace(records: list[StepRecord], since: float) -> dict[str, float]:
    """Sums over the steps after ``since`` that ran back to back (the loop did not wait for work
    before them): how many, their decode rows, prefill and context tokens, and the seconds from the
    step before each to it. Over a linear step model these sums price the same steps the replica
    ran (``cluster/serving/sla_predict.slowdown``), so measured over modelled is like for like."""
    sums = dict.fromkeys(PACE_FIELDS, 0.0)
    for prev, r in itertools.pairwise(records):
        if r.at < since or r.idle_ms > BACK_TO_BACK_IDLE_MS:
            continue
        sums["steps"] += 1
        sums["decode_rows"] += r.num_tokens - r.num_prefill_tokens
        sums["prefill_tokens"] += r.num_prefill_tokens
        sums["context_tokens"] += r.context_tokens
        sums["period_s"] += r.at - prev.at
    return sums


class StepProfiler:
    def __init__(self, history: int) -> None:
        self.records: deque[StepRecord] = deque(maxlen=history)
        self.total_steps = 0
        self.total_output_tokens = 0
        self.started = time.monotonic()

    def add(self, record: StepRecord) -> None:
        self.records.append(record)
        self.total_steps += 1
        self.total_output_tokens += record.num_sampled

    def output_tokens_per_s(self, window_s: float = 5.0) -> float:
        now = time.monotonic()
        recent = [r for r in self.records if now - r.at <= window_s]
        if not recent:
            return 0.0
        span = max(now - recent[0].at, 1e-3)
        return sum(r.num_sampled for r in recent) / span

    def pace(self, window_s: float = 10.0) -> dict[str, float]:
        """``step_pace`` over the last ``window_s`` (read from another thread: a copy of the records)."""
        since = time.monotonic() - window_s
        for _ in range(3):
            try:
                recent = list(itertools.takewhile(lambda r: r.at >= since, reversed(self.records)))
                break
            except RuntimeError:  # the loop appended while it was read
                continue
        else:
            return dict.fromkeys(PACE_FIELDS, 0.0)
        return step_pace(recent[::-1], since)

    def summary(self) -> dict:
        records = list(self.records)
        out: dict = {"steps": len(records), "total_steps": self.total_steps}
        if not records:
            return out
        for name in FIELDS:
            values = sorted(getattr(r, name) for r in records)
            out[name] = {
                "mean": statistics.fmean(values),
                "p50": values[len(values) // 2],
                "p99": values[min(len(values) - 1, int(len(values) * 0.99))],
            }
        # The host's whole share of a decode step (plan + inputs), over pure decode steps.
        host = sorted(r.schedule_ms + r.prepare_ms for r in records if r.num_prefill_tokens == 0) or [0.0]
        out["decode_host_prepare_ms"] = {
            "mean": statistics.fmean(host),
            "p50": host[len(host) // 2],
            "p99": host[min(len(host) - 1, int(len(host) * 0.99))],
        }
        out["graphed_fraction"] = sum(r.graphed for r in records) / len(records)
        out["kinds"] = {k: sum(r.kind == k for r in records) for k in KINDS}
        # Of each kind's steps that carried a prompt chunk, the share a graph ran (eager ones are
        # bound by kernel launches: what made logprob traffic slow before it rode the graphs).
        out["mixed_graphed_by_kind"] = {
            k: _graphed_share([r for r in records if r.kind == k and r.num_prefill_tokens]) for k in KINDS
        }
        out["mean_batch_size"] = statistics.fmean(r.batch_size for r in records)
        out["mean_tokens"] = statistics.fmean(r.num_tokens for r in records)
        out["device_busy_fraction"] = busy_fraction(records[1:])
        decode = [r for r in records[1:] if r.num_prefill_tokens == 0]
        out["decode_device_busy_fraction"] = busy_fraction(decode)
        return out

    def recent(self, count: int = 100) -> list[dict]:
        return [asdict(r) for r in list(self.records)[-count:]]
