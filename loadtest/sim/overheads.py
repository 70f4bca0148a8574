"""Per-request latencies outside the engine's steps, measured from one load-test run.

The step model times the engine; a request also pays for getting to it and back. Measured on the
local CPU cluster (docs/simulator.md "Fidelity"):

* dispatch: the router grants a slot (``dispatched`` in ``/admin/timings``) → the engine step
  that prefills the request starts (its record's ``at`` − its busy time). Taken only for requests
  that found the engine idle, so no step was in the way: the Serve handle hop and the replica's
  hand-off to the engine thread.
* client: client-seen TTFT − the router's TTFT for the same request (Serve proxy, HTTP, SSE
  parsing, ingress work before admission, the router relaying the token).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.records import RequestRecord
from loadtest.sim.record_profile import busy_ms

IDLE_BEFORE_S = 0.5  # no step delivered this long before the dispatch: the engine was idle


@dataclass(frozen=True, slots=True)
class Overheads:
    dispatch_s: float
    client_s: float
    dispatch_samples: int
    client_samples: int


def dispatch_latencies(timings: Sequence[dict], steps: Sequence[dict]) -> list[float]:
    """Grant → prefill step start (s) for requests that found the engine idle."""
    steps = sorted(steps, key=lambda r: r["at"])
    at = [r["at"] for r in steps]
    out = []
    for t in timings:
        i = bisect.bisect_left(at, t["dispatched"])
        idle = i == 0 or t["dispatched"] - at[i - 1] >= IDLE_BEFORE_S
        if idle and i < len(steps) and steps[i]["num_prefill_tokens"] == t["prompt_tokens"]:
            out.append(at[i] - busy_ms(steps[i]) / 1000.0 - t["dispatched"])
    return out


def client_latencies(records: Sequence[RequestRecord], timings: Sequence[dict]) -> list[float]:
    """Client TTFT − router TTFT (s), requests matched by the response id's request id."""
    by_id = {t["request_id"]: t for t in timings}
    out = []
    for r in records:
        t = by_id.get((r.server_id or "").rsplit("-", 1)[-1])
        if t is not None and r.first_token is not None and t.get("ttft") is not None:
            out.append(r.first_token - r.sent - t["ttft"])
    return out


def measure(records: Sequence[RequestRecord], timings: Sequence[dict], steps: Sequence[dict]) -> Overheads:
    """Medians (robust to the odd request that waited behind another's prefill)."""
    d, c = dispatch_latencies(timings, steps), client_latencies(records, timings)
    if not d or not c:
        raise ValueError(
            f"too few matched requests to measure overheads (dispatch {len(d)}, client {len(c)})"
        )
    return Overheads(statistics.median(d), statistics.median(c), len(d), len(c))
