"""Fairness of service between tenants; pure functions over records.

Service is counted in the fair queue's unit (VTC): input tokens × 1 + output tokens × 2, divided
by the tenant's weight, as it is *received*: input when the first token arrives (prefill is done),
each output token when its chunk arrives, so service can be binned into time windows.

Fairness is promised only among tenants of one SLA class (tier) and one weight, so the gap and
Jain's index compare, in each window, the tenants of one such group that were backlogged (had a
request outstanding) throughout it (``DEFINITION``; the bound they are held to is docs/tenancy.md's
``4S + 8M`` weighted tokens: S the largest request, M the tokens the running set can hold).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loadtest.records import RequestRecord

INPUT_COST = 1.0
OUTPUT_COST = 2.0


def service_events(r: RequestRecord) -> list[tuple[float, float]]:
    """(time, weighted service) of one successful request; output tokens spread over its chunks."""
    if not r.ok or r.first_token is None:
        return []
    events = [(r.first_token, INPUT_COST * r.prompt_tokens / r.weight)]
    times = r.token_times or [r.end if r.end is not None else r.first_token]
    per_chunk = OUTPUT_COST * r.output_tokens / r.weight / len(times)
    return events + [(t, per_chunk) for t in times]


def window_edges(start: float, end: float, width: float) -> np.ndarray:
    n = max(1, int(np.ceil((end - start) / width - 1e-9)))
    return start + width * np.arange(n + 1)


def service_per_window(records: Sequence[RequestRecord], edges: np.ndarray) -> dict[str, np.ndarray]:
    """Weighted service of each tenant in each window [edges[i], edges[i+1])."""
    out: dict[str, np.ndarray] = {}
    for r in records:
        row = out.setdefault(r.tenant, np.zeros(len(edges) - 1))
        for t, amount in service_events(r):
            i = int(np.searchsorted(edges, t, side="right")) - 1
            if 0 <= i < len(row):
                row[i] += amount
    return out


# A closed-loop client sends its next request a fraction of a millisecond after the last one
# ends; such a hand-over gap does not make the tenant idle.
HANDOVER_GAP_S = 0.05


def busy_intervals(
    records: Sequence[RequestRecord], gap_s: float = HANDOVER_GAP_S
) -> list[tuple[float, float]]:
    """Merged [send, end] spans (gaps up to ``gap_s`` bridged): when the tenant had work outstanding."""
    spans = sorted((r.sent, r.end) for r in records if r.end is not None)
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + gap_s:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def backlogged_windows(records: Sequence[RequestRecord], edges: np.ndarray) -> np.ndarray:
    """True for windows the tenant was backlogged throughout (one busy span covers the window)."""
    spans = busy_intervals(records)
    pairs = itertools.pairwise(edges)
    return np.array([any(a <= lo and hi <= b for a, b in spans) for lo, hi in pairs])


def jain_index(xs: Sequence[float]) -> float | None:
    """(Σx)² / (n·Σx²): 1 when all equal, 1/n when one gets everything; None without data."""
    arr = np.asarray(xs, dtype=float)
    if len(arr) == 0 or float((arr**2).sum()) == 0.0:
        return None
    return float(arr.sum() ** 2 / (len(arr) * (arr**2).sum()))


DEFINITION = (
    "per window: service = (prompt + 2 × output tokens) / weight received in it; max service gap = "
    "largest max−min over the tenants of one (SLA class, weight) group backlogged throughout the "
    "window; Jain = (Σx)²/(n·Σx²) over the same tenants, mean and minimum over windows and groups with "
    "≥ 2 (also per group); "
    "bound (docs/tenancy.md): gap <= 4S + 8M weighted tokens"
)


@dataclass(frozen=True, slots=True)
class FairnessReport:
    window_s: float
    edges: list[float]
    service: dict[str, list[float]]  # weighted service per window
    backlogged: dict[str, list[bool]]
    max_service_gap: float | None  # weighted tokens within one window, among backlogged tenants
    max_service_gap_rate: float | None  # the same gap per second of window
    jain_backlogged_mean: float | None  # mean over windows with ≥ 2 backlogged tenants
    jain_overall: float | None  # over the whole run's weighted service, all tenants
    windows_compared: int  # (window, group) pairs with ≥ 2 backlogged tenants
    jain_backlogged_min: float | None = None  # the least fair such (window, group)
    # "class/w<weight>" -> its tenants, windows compared, Jain mean/min and max gap (groups of ≥ 2)
    groups: dict[str, dict] = field(default_factory=dict)
    definition: str = DEFINITION


def fairness_report(
    records: Sequence[RequestRecord], start: float, end: float, width: float
) -> FairnessReport:
    edges = window_edges(start, end, width)
    by_tenant: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_tenant.setdefault(r.tenant, []).append(r)
    service = service_per_window(records, edges)
    backlog = {t: backlogged_windows(rs, edges) for t, rs in by_tenant.items()}
    groups: dict[tuple[str, float], list[str]] = {}
    for t, rs in by_tenant.items():
        groups.setdefault((rs[0].sla_class, rs[0].weight), []).append(t)
    gaps, jains = [], []
    per_group = {}
    for (cls, weight), members in sorted(groups.items()):
        g_gaps, g_jains = _group_windows(members, service, backlog, len(edges) - 1)
        gaps += g_gaps
        jains += g_jains
        if len(members) >= 2:
            per_group[f"{cls}/w{weight:g}"] = _group_figures(sorted(members), g_gaps, g_jains)
    gap = max(gaps) if gaps else None
    valid_jains = [j for j in jains if j is not None]
    return FairnessReport(
        window_s=width,
        edges=[float(e) for e in edges],
        service={t: [float(v) for v in row] for t, row in sorted(service.items())},
        backlogged={t: [bool(b) for b in row] for t, row in sorted(backlog.items())},
        max_service_gap=gap,
        max_service_gap_rate=None if gap is None else gap / width,
        jain_backlogged_mean=float(np.mean(valid_jains)) if valid_jains else None,
        jain_overall=jain_index([float(row.sum()) for row in service.values()]),
        windows_compared=len(gaps),
        jain_backlogged_min=min(valid_jains) if valid_jains else None,
        groups=per_group,
    )


def _group_windows(
    members: list[str], service: dict[str, np.ndarray], backlog: dict[str, np.ndarray], windows: int
) -> tuple[list[float], list[float | None]]:
    """Service gap and Jain's index of each window in which ≥ 2 of the group were backlogged."""
    gaps, jains = [], []
    for i in range(windows):
        xs = [float(service[t][i]) for t in members if backlog[t][i]]
        if len(xs) >= 2:
            gaps.append(max(xs) - min(xs))
            jains.append(jain_index(xs))
    return gaps, jains


def _group_figures(members: list[str], gaps: list[float], jains: list[float | None]) -> dict:
    valid = [j for j in jains if j is not None]
    return {
        "tenants": members,
        "windows_compared": len(gaps),
        "jain_mean": float(np.mean(valid)) if valid else None,
        "jain_min": min(valid) if valid else None,
        "max_service_gap": max(gaps) if gaps else None,
    }
