"""The run's summary: per tenant, per class and overall metrics, fairness, errors, cost, timelines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from loadtest.fairness import fairness_report, window_edges
from loadtest.metrics import errors_by_type, group_metrics, measured_window
from loadtest.records import RequestRecord
from loadtest.share_split import attainment_by_share, share_split
from tenancy import SLAClass

MIN_WINDOW_S = 1.0
WINDOWS_PER_RUN = 60


def default_window(duration_s: float) -> float:
    # ~60 windows per run (1 s for a minute's load): short enough that tenants are often backlogged for
    # a whole window (the gap compares only those), long enough to hold several tokens per tenant.
    return max(MIN_WINDOW_S, duration_s / WINDOWS_PER_RUN)


def cost(records: Sequence[RequestRecord], replica_seconds: float, dollars_per_hour: float) -> dict:
    """GPU dollars of the run, per successful response, and each tenant's share by tokens served."""
    dollars = replica_seconds * dollars_per_hour / 3600.0
    ok = [r for r in records if r.ok]
    tokens: dict[str, int] = {}
    count: dict[str, int] = {}
    for r in ok:
        tokens[r.tenant] = tokens.get(r.tenant, 0) + r.prompt_tokens + r.output_tokens
        count[r.tenant] = count.get(r.tenant, 0) + 1
    total = sum(tokens.values())
    per_tenant = {t: (dollars * tokens[t] / total / count[t]) if total else None for t in sorted(tokens)}
    return {
        "replica_seconds": replica_seconds,
        "gpu_dollars_per_hour": dollars_per_hour,
        "dollars": dollars,
        "dollars_per_success": dollars / len(ok) if ok else None,
        "dollars_per_success_by_tenant": per_tenant,
    }


def timeline(records: Sequence[RequestRecord], edges: np.ndarray) -> dict:
    """Per tenant and window: output tokens/s (by token arrival) and non-ok endings (by end time; a
    request cut by the client's deadline is not one: the server did not end it)."""
    width = float(edges[1] - edges[0])
    tokens: dict[str, np.ndarray] = {}
    failures: dict[str, np.ndarray] = {}
    for r in records:
        tok = tokens.setdefault(r.tenant, np.zeros(len(edges) - 1))
        bad = failures.setdefault(r.tenant, np.zeros(len(edges) - 1))
        if r.ok:
            per_chunk = r.output_tokens / max(1, len(r.token_times))
            for t in r.token_times:
                _add(tok, edges, t, per_chunk)
        elif r.end is not None and not r.cut:
            _add(bad, edges, r.end, 1.0)
    return {
        "edges": [float(e) for e in edges],
        "output_tps": {t: (v / width).tolist() for t, v in sorted(tokens.items())},
        "not_ok": {t: v.tolist() for t, v in sorted(failures.items())},
    }


def _add(row: np.ndarray, edges: np.ndarray, t: float, amount: float) -> None:
    i = int(np.searchsorted(edges, t, side="right")) - 1
    if 0 <= i < len(row):
        row[i] += amount


def summarize(
    records: Sequence[RequestRecord],
    classes: Sequence[SLAClass],
    meta: dict,
    replica_seconds: float,
    dollars_per_hour: float,
    window_s: float | None = None,
) -> dict:
    """Everything the report shows, as plain JSON-able data.

    Latency, throughput and attainment leave warm-up requests out; service and the timelines
    count every request (a warm-up request still takes its share of the replica after warm-up).
    Attainment leaves requests cut by the client's own deadline out too (``cut`` counts them;
    ``meta["drain"]`` says how the run's drain ended, ``loadtest/drain.py``).
    ``meta["capacity_output_tps"]``, when known, decides which tenants are within their fair
    share (``loadtest/share_split.py``); without it the run's own output throughput stands in.
    """
    by_class = {c.name: c for c in classes}
    measured = [r for r in records if not r.warmup]
    span = measured_window(measured)
    width = window_s or default_window(meta.get("duration_s", span) or 1.0)
    end = max((r.end for r in records if r.end is not None), default=width)
    edges = window_edges(0.0, max(end, width), width)
    tenants = {}
    for tid in sorted({r.tenant for r in records}):
        rs = [r for r in measured if r.tenant == tid]
        first = next(r for r in records if r.tenant == tid)
        tenants[tid] = (
            {"sla_class": first.sla_class, "weight": first.weight}
            | group_metrics(rs, by_class, span)
            | {"errors": errors_by_type(rs)}
        )
    classes_out = {
        name: group_metrics([r for r in measured if r.sla_class == name], by_class, span)
        for name in sorted({r.sla_class for r in measured})
    }
    split = share_split(records, meta.get("duration_s") or span or 1.0, meta.get("capacity_output_tps"))
    within = {t: v["within_share"] for t, v in split["tenants"].items()}
    for tid, v in split["tenants"].items():
        tenants[tid]["within_share"] = v["within_share"]
    return {
        "meta": meta,
        "requests_total": len(records),
        "requests_measured": len(measured),
        "requests_warmup": len(records) - len(measured),
        "window_s": span,
        "overall": group_metrics(measured, by_class, span),
        "tenants": tenants,
        "classes": classes_out,
        "fair_share": split,
        "attainment_by_share": attainment_by_share(measured, by_class, within, span),
        "sla_targets": {c.name: c.model_dump() for c in classes},
        "errors": errors_by_type(measured),
        "fairness": asdict(fairness_report(records, float(edges[0]), float(edges[-1]), width)),
        "timeline": timeline(records, edges),
        "cost": cost(records, replica_seconds, dollars_per_hour),
    }
