"""Summary figures of one run, with the load generator's metric definitions (``vllm bench serve``).

TTFT = first token − send; TPOT = (E2E − TTFT)/(output − 1); attainment = requests meeting their
class's targets over requests *offered* (rejections and timeouts count as misses; the cluster's
SLA report divides by requests served instead, also given), also split into tenants within their
max-min fair share and over it (``loadtest/sim/fair_share.py``); fairness figures are defined in
``FAIRNESS_DEFINITIONS`` (each beside the VTC bound); dollars per successful response =
replica-hours × price / successes.
"""

from __future__ import annotations

import numpy as np

from loadtest.sim.fair_share import within_share
from loadtest.sim.outcomes import OK, STATUS_NAMES
from loadtest.sim.service_curve import delivered_service
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
    fair = within_share(trace)[trace.tenant]
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
            "ttft_attainment": _ratio(met_ttft, mask),
            "ttft_attainment_within_share": _ratio(met_ttft, mask & fair),
            "ttft_attainment_over_share": _ratio(met_ttft, mask & ~fair),
            "attainment": _ratio(met_all, mask),
            "attainment_within_share": _ratio(met_all, mask & fair),
            "attainment_over_share": _ratio(met_all, mask & ~fair),
            "attainment_of_served": _ratio(met_all, served),
            "offered_within_share": int((mask & fair).sum()),
            "goodput_rps": float(met_all.sum() / span),
            "ttft_s": _pcts(ttft[served]),
        }
    return out


def _ratio(met: np.ndarray, of: np.ndarray) -> float | None:
    n = int(of.sum())
    return float((met & of).sum() / n) if n else None


FAIRNESS_DEFINITIONS = {
    "service": "settled service: the weighted tokens a tenant has received by a sample time, prompt × 1 "
    "once its first token arrived, output × 2 as it streamed (spread from first token to end), divided by "
    "the tenant's weight; not the work dispatched and still in flight, which the fair queue's counters "
    "charge ahead of delivery (VTC's bound, docs/tenancy.md, is on service received)",
    "backlogged": "the tenant had a request waiting in the fair queue at every instant of the window "
    "(a tenant whose queue empties is lifted on return and banks no credit)",
    "group": "tenants of one SLA class (tier) and one weight; fairness is only promised within it",
    "max_service_gap": "largest max−min of settled service received over a window by the tenants of one "
    "group backlogged throughout it (windows of 30, 120, 600 s on the 5-s sample grid)",
    "jain": "Jain's index (Σx)²/(n·Σx²) of the service received in one 30-s window by the tenants of "
    "one group backlogged throughout it; mean and minimum over windows and groups with ≥ 2 tenants",
    "vtc_bound": "docs/tenancy.md: service gap <= 4·S + 8·M weighted tokens (S: largest request, "
    "prompt + max_tokens; M: tokens the running set can hold), 2·S-wide counters without refunds",
    "max_service_gap_at": "where the max service gap is: window, its start (s), the group, and how many "
    "of its tenants were backlogged throughout (the gap is a max−min: it grows with that number)",
}


def fairness(trace: Trace, run: RunResult) -> dict:
    times, backlog = run.sampler.arrays()
    if len(times) < 2:
        return {"jain": None, "max_service_gap": None, "groups_compared": 0}
    service = delivered_service(trace, run.outcomes, times)
    groups: dict[tuple[str, float], list[int]] = {}
    for k, t in enumerate(trace.tenants):
        groups.setdefault((t.sla_class, t.weight), []).append(k)
    step = float(np.median(np.diff(times)))
    gaps: dict[str, float | None] = {}
    at: dict | None = None
    for window in GAP_WINDOWS_S:
        lag = max(1, round(window / step))
        found = _max_gap_at(service, backlog, groups, lag)
        gaps[f"{window:g}s"] = None if found is None else found[0]
        if found is not None and (at is None or found[0] > at["gap"]):
            at = {"gap": found[0], "window_s": window, "start_s": float(times[found[2]])} | found[1]
    jains = _group_jains(service, backlog, groups, max(1, round(GAP_WINDOWS_S[0] / step)))
    s_max = int((trace.prompt + trace.max_tokens).max()) if len(trace) else 0
    return {
        "jain": float(np.mean(jains)) if jains else None,
        "jain_min": float(np.min(jains)) if jains else None,
        "groups_compared": len(jains),
        "max_service_gap": max((g for g in gaps.values() if g is not None), default=None),
        "max_service_gap_by_window": gaps,
        "max_service_gap_at": at,
        "largest_request_tokens": s_max,
        "definitions": FAIRNESS_DEFINITIONS,
    }


def _group_jains(service: np.ndarray, backlog: np.ndarray, groups: dict, lag: int) -> list[float]:
    """Jain's index per (window, group) with at least two tenants backlogged throughout."""
    if lag >= len(service):
        return []
    through = _backlogged_through(backlog, lag)
    delta = service[lag:] - service[:-lag]
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        d, m = delta[:, members], through[:, members]
        for row in np.flatnonzero(m.sum(axis=1) >= 2):
            x = d[row][m[row]]
            if (x**2).sum() > 0:
                out.append(float(x.sum() ** 2 / (len(x) * (x**2).sum())))
    return out


def _backlogged_through(backlog: np.ndarray, lag: int) -> np.ndarray:
    """[window start, tenant]: backlogged in every sample interval of the window."""
    not_backlogged = np.cumsum(np.vstack([np.zeros((1, backlog.shape[1])), ~backlog]), axis=0)
    return (not_backlogged[lag + 1 :] - not_backlogged[1:-lag]) == 0  # intervals i+1..i+lag


GapAt = tuple[float, dict, int]  # gap, its group and tenant count, the window's first sample


def _max_gap(service: np.ndarray, backlog: np.ndarray, groups: dict, lag: int) -> float | None:
    """Weighted tokens: the largest gap between two same-group tenants backlogged through a window."""
    found = _max_gap_at(service, backlog, groups, lag)
    return None if found is None else found[0]


def _max_gap_at(service: np.ndarray, backlog: np.ndarray, groups: dict, lag: int) -> GapAt | None:
    """``_max_gap`` with its group, how many tenants it compared, and the window's first sample."""
    if lag >= len(service):
        return None
    through = _backlogged_through(backlog, lag)
    delta = service[lag:] - service[:-lag]
    best = None
    for (sla_class, weight), members in groups.items():
        if len(members) < 2:
            continue
        d, m = delta[:, members], through[:, members]
        if not m.any():
            continue
        hi = np.where(m, d, -np.inf).max(axis=1)
        lo = np.where(m, d, np.inf).min(axis=1)
        spread = np.where(m.sum(axis=1) >= 2, hi - lo, -np.inf)
        row = int(spread.argmax())
        if spread[row] > -np.inf and (best is None or spread[row] > best[0]):
            where = {"sla_class": sla_class, "weight": weight, "tenants": int(m[row].sum())}
            best = (float(spread[row]), where, row)
    return best
