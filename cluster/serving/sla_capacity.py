"""A replica's capacity from the simulator's step model (``loadtest/sim/step_model.py``, its fitted
files in ``loadtest/sim/data/``).

``step_ms = a + b·batch + c·prefill_tokens + d·Σcontext``. The simulator hands its own ``StepModel``
in; the cluster reads the same shipped JSON files (``shipped_step``), since ``cluster`` may not import
``loadtest`` (which imports ``cluster``: tests/layout keeps the folders acyclic).

At a full batch ``B`` a request with prompt ``p`` and answer ``o`` takes ``o`` decode steps shared
by ``B`` sequences and adds ``c·p`` of prefill to the steps it joins, so it costs
``(o·step_ms(B, 0, B·(p + o/2)) / B + c·p) / 1000`` replica-seconds: the simulator's own capacity
estimate (``workload.capacity_rps``), per request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

STEP_DATA = Path(__file__).resolve().parents[2] / "loadtest" / "sim" / "data"


class StepTimes(Protocol):
    """What the prediction needs of a step model (``loadtest.sim.step_model.StepModel`` is one)."""

    a: float
    c: float

    def step_ms(self, batch: int, prefill_tokens: int = 0, context: int = 0) -> float: ...


@dataclass(frozen=True, slots=True)
class ShippedStep:
    """A shipped step model's coefficients, read from its JSON (the simulator's own files)."""

    a: float
    b: float
    c: float
    d: float
    name: str

    def step_ms(self, batch: int, prefill_tokens: int = 0, context: int = 0) -> float:
        return self.a + self.b * batch + self.c * prefill_tokens + self.d * context


def shipped_step(name_or_path: str) -> ShippedStep:
    """``step_<name>.json`` under ``loadtest/sim/data/``, or a JSON path; a clear error otherwise."""
    path = Path(name_or_path)
    if not path.exists():
        path = STEP_DATA / f"step_{name_or_path}.json"
    if not path.exists():
        shipped = ", ".join(sorted(p.stem.removeprefix("step_") for p in STEP_DATA.glob("step_*.json")))
        raise ValueError(f"no step model {name_or_path!r}; shipped: {shipped}")
    data = json.loads(path.read_text())
    keys = ("a_ms", "b_ms_per_seq", "c_ms_per_prefill_token", "d_ms_per_context_token")
    coeffs = [float(data[k]) for k in keys]
    if not all(math.isfinite(v) and v >= 0 for v in coeffs) or coeffs[0] <= 0:
        raise ValueError(f"{path}: step model coefficients must be finite, >= 0, with a > 0")
    return ShippedStep(*coeffs, name=data.get("name", path.stem))


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    """One replica's engine as the prediction models it: its step time and its full batch."""

    step: StepTimes
    batch: int  # sequences a replica runs at once under load: min(room, max_num_seqs)
    # The share of the step model's throughput the prediction counts on: arrivals are not a fluid,
    # and a replica near its full rate queues them in bursts.
    utilization: float = 1.0
    # The replicas' measured step time over the model's (``sla_predict.slowdown``): a step model
    # fitted on a whole H200 prices a replica on a slice of another card, or a loaded CPU box, as it
    # is, not as the fit's machine ran it.
    slowdown: float = 1.0

    def request_s(self, prompt: float, output: float) -> float:
        """Replica-seconds one request takes at a full batch (its decode share and its prefill), over
        the usable share of the replica."""
        b = max(1, self.batch)
        step_ms = self.step.step_ms(b, 0, int(b * (prompt + output / 2)))
        ms = max(output, 1.0) * step_ms / b + self.step.c * prompt
        return ms * self.slowdown / 1000.0 / self.utilization

    def first_token_s(self, prompt: float) -> float:
        """A request's own part of its TTFT once it reaches a replica: one step with its prefill."""
        return (self.step.a + self.step.c * prompt) * self.slowdown / 1000.0

    def tpot_s(self, batch: float, context: float) -> float:
        """Seconds per output token at ``batch`` running sequences of ``context`` tokens each."""
        b = max(1, round(batch))
        return self.step.step_ms(b, 0, int(b * context)) * self.slowdown / 1000.0

    def work_tokens_per_s(self, prompt: float, output: float) -> float:
        """Fair-share work (prompt + 2 × output, the fair queue's charge) one replica serves per second."""
        return (prompt + 2.0 * output) / self.request_s(prompt, output)


def shape_of(step_model: str, batch: int, utilization: float = 1.0) -> ReplicaShape:
    """A shipped step model by name (``h200-llama-3.1-8b``, ``cpu-smollm2-cluster``...) or a path."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    return ReplicaShape(shipped_step(step_model), batch, utilization)
