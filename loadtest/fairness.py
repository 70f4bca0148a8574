"""Fairness of service between tenants; pure functions over records.

Service is charged as fair share charges it (VTC): input tokens × 1 + output tokens × 2, divided
by the tenant's weight. Input is charged when the first token arrives (prefill is done), each
output token when its chunk arrives, so service can be binned into time windows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

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
    windows_compared: int


def fairness_report(
    records: Sequence[RequestRecord], start: float, end: float, width: float
) -> FairnessReport:
    edges = window_edges(start, end, width)
    by_tenant: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_tenant.setdefault(r.tenant, []).append(r)
    service = service_per_window(records, edges)
    backlog = {t: backlogged_windows(rs, edges) for t, rs in by_tenant.items()}
    gaps, jains = [], []
    for i in range(len(edges) - 1):
        xs = [service[t][i] for t in by_tenant if backlog[t][i]]
        if len(xs) >= 2:
            gaps.append(max(xs) - min(xs))
            jains.append(jain_index(xs))
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
    )
