"""Latency and throughput metrics with the ``vllm bench serve`` definitions; pure functions.

TTFT = first token − send; E2E = end − send; TPOT = (E2E − TTFT) / (output tokens − 1), defined
only with ≥ 2 output tokens; ITL = gaps between consecutive content chunks. Percentiles use
linear interpolation between order statistics (``numpy.percentile``'s default, as vLLM does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from loadtest.records import RequestRecord
from tenancy import SLAClass

PERCENTILES = (50, 90, 95, 99)


def ttft(r: RequestRecord) -> float | None:
    return None if r.first_token is None else r.first_token - r.sent


def e2e(r: RequestRecord) -> float | None:
    return None if r.end is None else r.end - r.sent


def tpot(r: RequestRecord) -> float | None:
    """Per answer: n > 1 answers stream side by side, each at the request's pace."""
    first, total = ttft(r), e2e(r)
    per_answer = r.output_tokens / max(1, r.choices)
    if first is None or total is None or per_answer < 2:
        return None
    return (total - first) / (per_answer - 1)


def itls(r: RequestRecord) -> list[float]:
    return [b - a for a, b in zip(r.token_times, r.token_times[1:], strict=False)]


def percentiles(values: Sequence[float], ps: Iterable[int] = PERCENTILES) -> dict[str, float | None]:
    """p50/p90/p95/p99 (+ mean) of the values; None for every key when there are none."""
    ps = tuple(ps)
    if len(values) == 0:
        return {"mean": None} | {f"p{p}": None for p in ps}
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean())} | {f"p{p}": float(np.percentile(arr, p)) for p in ps}


def meets_slo(r: RequestRecord, target: SLAClass) -> bool:
    """The whole SLA: a successful request within its class's TTFT, TPOT (when defined) and E2E targets."""
    total = e2e(r)
    met = meets_ttft(r, target) and meets_tpot(r, target)
    return met and total is not None and total <= target.e2e_target_s


def meets_ttft(r: RequestRecord, target: SLAClass) -> bool:
    """A successful request whose first token came within its class's TTFT target."""
    first = ttft(r)
    return r.ok and first is not None and first <= target.ttft_target_s


def meets_tpot(r: RequestRecord, target: SLAClass) -> bool:
    """A successful request within its class's TPOT target; one token has no TPOT, so it meets it."""
    per_token = tpot(r)
    return r.ok and (per_token is None or per_token <= target.tpot_target_s)


def measured_window(records: Sequence[RequestRecord]) -> float:
    """From the first send to the last end among the records (the span throughput is taken over)."""
    ends = [r.end for r in records if r.end is not None]
    if not records or not ends:
        return 0.0
    return max(ends) - min(r.sent for r in records)


def latency_stats(records: Sequence[RequestRecord]) -> dict[str, dict[str, float | None]]:
    ok = [r for r in records if r.ok]
    return {
        "ttft_s": percentiles([v for r in ok if (v := ttft(r)) is not None]),
        "tpot_s": percentiles([v for r in ok if (v := tpot(r)) is not None]),
        "itl_s": percentiles([g for r in ok for g in itls(r)]),
        "e2e_s": percentiles([v for r in ok if (v := e2e(r)) is not None]),
    }


def group_metrics(records: Sequence[RequestRecord], classes: dict[str, SLAClass], window_s: float) -> dict:
    """Counts, latency percentiles, throughput, goodput and SLA attainment of a set of records.

    A request **cut** by the client's own deadline (``loadtest/drain.py``) ended without a verdict:
    it is counted in ``cut`` and left out of every attainment's denominator, never a miss.
    ``sla_attainment`` (the whole SLA: TTFT, TPOT and E2E) is met / served, where served excludes
    admission rejections (HTTP 429), as the cluster's own report counts it, and cut requests;
    ``attainment_all`` is the whole SLA over every request but the cut ones (a refused one misses);
    ``ttft_attainment`` and ``tpot_attainment`` count one target alone, over the same requests.
    """
    ok = [r for r in records if r.ok]
    met = sum(1 for r in ok if meets_slo(r, classes[r.sla_class]))
    ttft_ok = sum(1 for r in ok if meets_ttft(r, classes[r.sla_class]))
    tpot_ok = sum(1 for r in ok if meets_tpot(r, classes[r.sla_class]))
    judged = [r for r in records if not r.cut]
    served = [r for r in judged if not r.rejected]
    cut = len(records) - len(judged)
    window = max(window_s, 1e-9)
    return {
        "requests": len(records),
        "ok": len(ok),
        "rejected": len(judged) - len(served),
        "failed": len(served) - len(ok),
        "cut": cut,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": sum(r.output_tokens for r in ok),
        "request_throughput_rps": len(ok) / window,
        "output_throughput_tps": sum(r.output_tokens for r in ok) / window,
        "goodput_rps": met / window,
        "slo_met": met,
        "sla_attainment": _share(met, served),
        "attainment_all": _share(met, judged),
        "ttft_attainment": _share(ttft_ok, judged),
        "tpot_attainment": _share(tpot_ok, judged),
    } | latency_stats(records)


def _share(met: int, of: Sequence[RequestRecord]) -> float | None:
    return met / len(of) if of else None


def errors_by_type(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Counts of non-ok endings keyed by the error code (``429:rate_limit_exceeded``, ``client_timeout``);
    a cut request is not an error (``group_metrics``' ``cut`` counts it)."""
    out: dict[str, int] = {}
    for r in records:
        if not r.ok and not r.cut:
            key = r.error or r.status
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
