"""Summary figures of one run, with the load generator's metric definitions (``vllm bench serve``).

TTFT = first token − send; TPOT = (E2E − TTFT)/(output − 1); attainment = requests meeting their
class's targets over requests *offered* (rejections and timeouts count as misses; the cluster's
SLA report divides by requests served instead, also given); Jain's index = (Σx)²/(n·Σx²) over
weighted service of the tenants backlogged in at least half of the samples; max service gap =
largest |ΔW_f − ΔW_g| over sampled windows in which two tenants of the same class and weight were
backlogged at every sample; dollars per successful response = replica-hours × price / successes.
"""

from __future__ import annotations

import numpy as np

from loadtest.sim.outcomes import OK, STATUS_NAMES
from loadtest.sim.simulation import RunResult
from loadtest.sim.workload import Trace
from tenancy import TenancyConfig

GAP_WINDOWS_S = (30.0, 120.0, 600.0)


def summarize(trace: Trace, config: TenancyConfig, run: RunResult) -> dict:
    o = run.outcomes
    ok = o.status == OK
    ttft = o.first_token - trace.arrival
    e2e = o.end - trace.arrival
    tpot = np.where(o.output > 1, (e2e - ttft) / np.maximum(o.output - 1, 1), np.nan)
    span = max(run.end_time - float(trace.arrival[0]), 1e-9) if len(trace) else 1.0
    gpu_hours = run.replica_seconds / 3600.0
    dollars = gpu_hours * config.gpu_dollars_per_hour
    classes = _per_class(trace, config, ok, ttft, tpot, e2e, span)
    return {
        "policy": run.policy.model_dump(),
        "requests": len(trace),
        "status": {name: int((o.status == k).sum()) for k, name in enumerate(STATUS_NAMES)},
        "simulated_s": span,
        "throughput_rps": float(ok.sum() / span),
        "output_tokens_per_s": float(o.output[ok].sum() / span),
        "ttft_s": _pcts(ttft[ok]),
        "tpot_s": _pcts(tpot[ok & (o.output > 1)]),
        "e2e_s": _pcts(e2e[ok]),
        "classes": classes,
        "fairness": fairness(trace, run),
        "gpu_hours": gpu_hours,
        "dollars": dollars,
        "dollars_per_success": dollars / max(1, int(ok.sum())),
        "peak_replicas": run.peak_replicas,
        "scale_decisions": run.scale_decisions,
        "events": run.events,
        "wall_s": run.wall_s,
    }


def _pcts(x: np.ndarray) -> dict:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(x.mean())}


def _per_class(trace: Trace, config: TenancyConfig, ok, ttft, tpot, e2e, span) -> dict:
    class_of = np.array([t.sla_class for t in trace.tenants])[trace.tenant]
    out = {}
    for c in config.sla_classes:
        mask = class_of == c.name
        served = ok & mask
        met_ttft = served & (ttft <= c.ttft_target_s)
        met_all = met_ttft & (e2e <= c.e2e_target_s) & ~(tpot > c.tpot_target_s)
        offered, n_served = int(mask.sum()), int(served.sum())
        out[c.name] = {
            "offered": offered,
            "served": n_served,
            "ttft_attainment": float(met_ttft.sum() / offered) if offered else None,
            "attainment": float(met_all.sum() / offered) if offered else None,
            "attainment_of_served": float(met_all.sum() / n_served) if n_served else None,
            "goodput_rps": float(met_all.sum() / span),
            "ttft_s": _pcts(ttft[served]),
        }
    return out


def fairness(trace: Trace, run: RunResult) -> dict:
    times, service, backlog = run.sampler.arrays()
    if len(times) < 2:
        return {"jain": None, "max_service_gap": None, "contending_tenants": 0}
    contending = backlog.mean(axis=0) >= 0.5
    x = service[-1][contending]
    jain = float(x.sum() ** 2 / (len(x) * (x**2).sum())) if len(x) and (x**2).sum() > 0 else None
    groups: dict[tuple[str, float], list[int]] = {}
    for k, t in enumerate(trace.tenants):
        groups.setdefault((t.sla_class, t.weight), []).append(k)
    step = float(np.median(np.diff(times)))
    gaps = {}
    for window in GAP_WINDOWS_S:
        lag = max(1, round(window / step))
        gaps[f"{window:g}s"] = _max_gap(service, backlog, groups, lag)
    return {
        "jain": jain,
        "contending_tenants": int(contending.sum()),
        "max_service_gap": max((g for g in gaps.values() if g is not None), default=None),
        "max_service_gap_by_window": gaps,
    }


def _max_gap(service: np.ndarray, backlog: np.ndarray, groups: dict, lag: int) -> float | None:
    """Weighted tokens: the largest gap between two same-group tenants backlogged through a window."""
    if lag >= len(service):
        return None
    not_backlogged = np.cumsum(np.vstack([np.zeros((1, backlog.shape[1])), ~backlog]), axis=0)
    through = (not_backlogged[lag + 1 :] - not_backlogged[: -lag - 1]) == 0  # windows [i, i+lag]
    delta = service[lag:] - service[:-lag]
    best = None
    for members in groups.values():
        if len(members) < 2:
            continue
        d, m = delta[:, members], through[:, members]
        if not m.any():
            continue
        hi = np.where(m, d, -np.inf).max(axis=1)
        lo = np.where(m, d, np.inf).min(axis=1)
        pair = m.sum(axis=1) >= 2
        if pair.any():
            g = float((hi - lo)[pair].max())
            best = g if best is None else max(best, g)
    return best
