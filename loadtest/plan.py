"""The request plan: who sends what and when, fixed before the run by the scenario's seed."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from loadtest.arrivals import arrival_times
from loadtest.prompts import draw_output, draw_prompt
from loadtest.sampling_mix import GREEDY, sampling_mix, sampling_rng
from loadtest.scenario import Scenario, TenantLoad


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send: ``at`` is its offset from the start (None: closed loop, send when free)."""

    index: int
    tenant: str
    at: float | None
    prompt: str
    max_tokens: int
    sampling: dict = field(default_factory=lambda: dict(GREEDY))  # temperature etc. (sampling_mix.py)


def tenant_rng(seed: int, tenant_id: str) -> np.random.Generator:
    # A tenant's stream does not change when another tenant is added to the scenario.
    return np.random.default_rng([seed, zlib.crc32(tenant_id.encode())])


def open_loop_plan(
    load: TenantLoad, duration_s: float, rng: np.random.Generator, mix: SamplingDraw | None = None
) -> list[PlannedRequest]:
    # A tenant that sends only within [start_s, end_s): its process runs over that span alone.
    end = min(duration_s, load.end_s or duration_s)
    span = max(0.0, end - load.start_s)
    times = load.start_s + arrival_times(load.rate or 0.0, load.arrival, span, rng) if span else []
    mix = mix or SamplingDraw("greedy", rng)
    return [
        PlannedRequest(
            i, load.id, float(t), draw_prompt(load.prompt, rng), draw_output(load.output, rng), mix.next()
        )
        for i, t in enumerate(times)
    ]


class SamplingDraw:
    """A tenant's sampling settings, request after request: the mix (with or without its JSON
    schemas; the same draws either way), or greedy when pinned."""

    def __init__(self, sampling: str, rng: np.random.Generator) -> None:
        self._mix = sampling != "greedy"
        self._schemas = sampling == "mix"
        self._rng = rng

    def next(self) -> dict:
        if not self._mix:
            return dict(GREEDY)
        fields = sampling_mix(self._rng)
        if not self._schemas:
            fields.pop("response_format", None)
        return fields


class ClosedLoopSource:
    """Endless requests for a closed-loop tenant, drawn lazily from its own generator."""

    def __init__(self, load: TenantLoad, seed: int, sampling: str = "greedy") -> None:
        self.load = load
        self._rng = tenant_rng(seed, load.id)
        self._mix = SamplingDraw(sampling, sampling_rng(seed, load.id))
        self._next = 0

    def next(self) -> PlannedRequest:
        i, self._next = self._next, self._next + 1
        return PlannedRequest(
            i,
            self.load.id,
            None,
            draw_prompt(self.load.prompt, self._rng),
            draw_output(self.load.output, self._rng),
            self._mix.next(),
        )


def build_open_plan(scenario: Scenario) -> list[PlannedRequest]:
    """All open-loop requests of all tenants, ordered by send time."""
    plan: list[PlannedRequest] = []
    for load in scenario.tenants:
        if load.rate is not None:
            mix = SamplingDraw(scenario.sampling_of(load), sampling_rng(scenario.seed, load.id))
            plan.extend(open_loop_plan(load, scenario.duration_s, tenant_rng(scenario.seed, load.id), mix))
    return sorted(plan, key=lambda p: (p.at, p.tenant))
