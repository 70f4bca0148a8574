"""Scale a load-generator scenario to platform size and draw its trace (numpy, seeded).

Tenant ``i`` clones scenario tenant ``i mod T`` (SLA class, arrival process, length laws); rates
are the template's rate × a Zipf factor (a few heavy tenants, many light), renormalised so the
offered work is ``load_factor`` × the cluster's estimated capacity; a diurnal sine modulates every
tenant (time warp), and ``on_off`` / ``gamma`` templates keep their burstiness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loadtest.scenario import Scenario, TenantLoad
from loadtest.sim.spec import ClusterSpec, ScaleSpec
from loadtest.sim.step_model import StepModel


@dataclass(frozen=True, slots=True)
class SimTenant:
    id: str
    sla_class: str
    weight: float
    rate: float  # mean requests per second
    template: str
    max_size: int  # largest prompt + max_tokens it can send


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests sorted by arrival; ``tenant`` indexes ``tenants``."""

    tenants: tuple[SimTenant, ...]
    arrival: np.ndarray
    tenant: np.ndarray
    prompt: np.ndarray
    max_tokens: np.ndarray
    duration_s: float
    capacity_rps: float

    def __len__(self) -> int:
        return len(self.arrival)


def mean_prompt(t: TenantLoad, scale: ScaleSpec) -> float:
    p = t.prompt
    return {
        "fixed": lambda: p.tokens,
        "uniform": lambda: (p.min + p.max) / 2,
        "bundled": lambda: scale.bundled_prompt_tokens,
    }[p.kind]()


def mean_output(t: TenantLoad) -> float:
    o = t.output
    return o.tokens if o.kind == "fixed" else (o.min + o.max) / 2


def capacity_rps(cluster: ClusterSpec, step: StepModel, prompt: float, output: float) -> float:
    """Requests per second the replicas finish with full batches (the room, at most max_num_seqs)."""
    batch = min(cluster.replica_room, cluster.max_num_seqs)
    step_ms = step.step_ms(batch, 0, int(batch * (prompt + output / 2)))
    per_request_s = (output * step_ms / batch + step.c * prompt) / 1000.0
    return cluster.replicas / per_request_s


def build_trace(scenario: Scenario, scale: ScaleSpec, cluster: ClusterSpec, step: StepModel) -> Trace:
    rng = np.random.default_rng(scenario.seed if scale.seed is None else scale.seed)
    templates = scenario.tenants
    n = scale.tenants
    base = np.array([_template_rate(templates[i % len(templates)]) for i in range(n)])
    ranks = rng.permutation(n) + 1
    rates = base * ranks.astype(float) ** -scale.rate_skew
    share = rates / rates.sum()
    prompt_mean = sum(s * mean_prompt(templates[i % len(templates)], scale) for i, s in enumerate(share))
    output_mean = sum(s * mean_output(templates[i % len(templates)]) for i, s in enumerate(share))
    cap = capacity_rps(cluster, step, prompt_mean, output_mean)
    total_rate = scale.load_factor * cap
    duration = scale.requests / total_rate
    rates = share * total_rate
    heavy = set(np.argsort(-rates)[: math.ceil(scale.heavy_fraction * n)].tolist())
    tenants, parts = [], []
    for i in range(n):
        t = templates[i % len(templates)]
        times = _arrivals(t, float(rates[i]), duration, rng)
        prompts = _lengths_prompt(t, len(times), scale, rng)
        outputs = _lengths_output(t, len(times), rng)
        weight = scale.heavy_weight if i in heavy else t.weight
        tenants.append(
            SimTenant(f"{t.id}-{i:04d}", t.sla_class, weight, float(rates[i]), t.id, _max_size(t, scale))
        )
        parts.append((times, np.full(len(times), i, dtype=np.int32), prompts, outputs))
    arrival = _warp(np.concatenate([p[0] for p in parts]), duration, scale)
    order = np.argsort(arrival, kind="stable")
    cols = [np.concatenate([p[k] for p in parts])[order] for k in (1, 2, 3)]
    return Trace(tuple(tenants), arrival[order], *cols, duration_s=duration, capacity_rps=cap)


def _template_rate(t: TenantLoad) -> float:
    return t.rate if t.rate is not None else float(t.concurrency or 1)


def _arrivals(t: TenantLoad, rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    a = t.arrival
    if a.process == "constant":
        return np.arange(rng.random() / rate, duration, 1.0 / rate)
    if a.process == "on_off":
        period = a.on_s + a.off_s
        boosted = rate * period / a.on_s
        times = np.sort(rng.random(rng.poisson(boosted * duration)) * duration)
        return times[((times + rng.random() * period) % period) < a.on_s]
    if a.process == "gamma":
        k = a.burstiness
        gaps = rng.gamma(k, 1.0 / (rate * k), size=int(rate * duration * 1.3) + 20)
        times = np.cumsum(gaps)
        return times[times < duration]
    return np.sort(rng.random(rng.poisson(rate * duration)) * duration)


def _warp(times: np.ndarray, duration: float, scale: ScaleSpec) -> np.ndarray:
    """Operational time → clock time under rate factor 1 + A·sin(2π·cycles·t/D) (mean 1)."""
    amp, cyc = scale.diurnal_amplitude, scale.diurnal_cycles
    if amp == 0 or cyc == 0:
        return times
    grid = np.linspace(0.0, duration, 4097)
    w = 2 * math.pi * cyc / duration
    cumulative = grid + amp * (1 - np.cos(w * grid)) / w
    cumulative *= duration / cumulative[-1]
    return np.interp(times, cumulative, grid)


def _lengths_prompt(t: TenantLoad, n: int, scale: ScaleSpec, rng: np.random.Generator) -> np.ndarray:
    p = t.prompt
    if p.kind == "fixed":
        return np.full(n, p.tokens, dtype=np.int32)
    if p.kind == "uniform":
        return rng.integers(p.min, p.max + 1, size=n).astype(np.int32)
    sigma = 0.6
    mu = math.log(scale.bundled_prompt_tokens) - sigma**2 / 2
    return np.clip(rng.lognormal(mu, sigma, size=n), 4, 2000).astype(np.int32)


def _lengths_output(t: TenantLoad, n: int, rng: np.random.Generator) -> np.ndarray:
    o = t.output
    if o.kind == "fixed":
        return np.full(n, o.tokens, dtype=np.int32)
    return rng.integers(o.min, o.max + 1, size=n).astype(np.int32)


def _max_size(t: TenantLoad, scale: ScaleSpec) -> int:
    p, o = t.prompt, t.output
    prompt = {"fixed": lambda: p.tokens, "uniform": lambda: p.max, "bundled": lambda: 2000}[p.kind]()
    return int(prompt + (o.tokens if o.kind == "fixed" else o.max))
