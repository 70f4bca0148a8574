"""The SLA autoscaling policy's inputs and outputs: plain dataclasses, no Ray (``sla_policy.py``).

Per SLA class the policy sees the work waiting for it and arriving, split into what tenants ask
within their fair share and what they ask beyond it (``sla_share.py``), and what the class's
requests measured lately (TTFT, TPOT). Per model it sees the replicas: how many serve, how many
are starting, what they run, and how long a replica takes to start (each replica measures and
publishes its own: load + graph capture, from its process start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Work:
    """One part (within or over share) of a class's work: what waits now and what arrives."""

    waiting_requests: float = 0.0
    waiting_prompt_tokens: float = 0.0
    waiting_output_tokens: float = 0.0  # the waiting requests' max_tokens
    rate_rps: float = 0.0  # arrivals per second, over the recent window
    rate_slope: float = 0.0  # change of that rate per second (the trend the prediction extends)
    mean_prompt_tokens: float = 0.0  # of the recent arrivals
    mean_output_tokens: float = 0.0
    window_rate_rps: float = 0.0  # the window's mean rate (a scale-down never counts on less)

    def plus(self, other: Work) -> Work:
        """Both parts as one (``scale_for_over_share``): sums, and means weighted by rate."""
        rate = self.rate_rps + other.rate_rps

        def mean(a: float, b: float) -> float:
            return (a * self.rate_rps + b * other.rate_rps) / rate if rate > 0 else max(a, b)

        return Work(
            self.waiting_requests + other.waiting_requests,
            self.waiting_prompt_tokens + other.waiting_prompt_tokens,
            self.waiting_output_tokens + other.waiting_output_tokens,
            rate,
            self.rate_slope + other.rate_slope,
            mean(self.mean_prompt_tokens, other.mean_prompt_tokens),
            mean(self.mean_output_tokens, other.mean_output_tokens),
            self.window_rate_rps + other.window_rate_rps,
        )

    @property
    def active(self) -> bool:
        return self.waiting_requests > 0 or self.rate_rps > 0


@dataclass(frozen=True, slots=True)
class ClassLoad:
    """One SLA class: its targets (tenancy's ``SLAClass``), the attainment it must keep, its work."""

    name: str
    tier: int
    ttft_target_s: float
    tpot_target_s: float
    goal: float  # attainment the class must keep (a share of its requests meeting TTFT and TPOT)
    within: Work = field(default_factory=Work)
    over: Work = field(default_factory=Work)
    measured_ttft_s: float | None = None  # recent median TTFT of its requests (calibration)
    measured_tpot_s: float | None = None


@dataclass(frozen=True, slots=True)
class StepPace:
    """The replicas' recent back-to-back engine steps, summed (``replica/profiler.step_pace``)."""

    steps: float = 0.0
    decode_rows: float = 0.0
    prefill_tokens: float = 0.0
    context_tokens: float = 0.0
    period_s: float = 0.0  # seconds from each step's predecessor to it


@dataclass(frozen=True, slots=True)
class PoolState:
    """The model's replicas as the policy sees them."""

    ready: int  # serving
    starting: int = 0  # asked for, not serving yet
    starting_left_s: float = 0.0  # how long the starting ones still take (estimate)
    running_requests: float = 0.0  # on the engines now (all replicas)
    start_time_s: float = 60.0  # a replica's measured start: process start → serving
    pace: StepPace = field(default_factory=StepPace)  # what the replicas' steps took (calibration)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted attainment per class over the horizon, with ``replicas`` asked for."""

    replicas: int
    attainment: dict[str, float]  # class → share of its (within-share) requests meeting its targets
    ttft_s: dict[str, float]  # class → predicted TTFT of its last arrival in the horizon
    tpot_s: float
    late: dict[str, float] = field(default_factory=dict)  # attainment of arrivals after one start time
    # class → replica-seconds of its tier's and more urgent tiers' work still queued at the horizon
    backlog_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy asks for and why, with the predictions it compared."""

    desired: int
    current: int
    reason: str
    bound: int  # the most replicas allowed (max_replicas, and the cost ceiling)
    predictions: tuple[Prediction, ...]
    slowdown: float = 1.0  # the replicas' measured step time over the step model's (sla_predict)

    def as_dict(self) -> dict:
        """JSON-safe: a prediction that never ends within the horizon (an inf TTFT) is ``None``, so
        the decision survives the board, ``/admin/state`` and every JSON reader."""
        return {
            "desired": self.desired,
            "current": self.current,
            "reason": self.reason,
            "bound": self.bound,
            "slowdown": self.slowdown,
            "predictions": [
                {
                    "replicas": p.replicas,
                    "attainment": _finite(p.attainment),
                    "after_start": _finite(p.late),
                    "ttft_s": _finite(p.ttft_s),
                    "tpot_s": p.tpot_s if math.isfinite(p.tpot_s) else None,
                }
                for p in self.predictions
            ],
        }


def _finite(values: dict[str, float]) -> dict[str, float | None]:
    """``values`` with inf and NaN as ``None`` (JSON has neither)."""
    return {k: v if math.isfinite(v) else None for k, v in values.items()}
