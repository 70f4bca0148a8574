"""Client-side records against the cluster's own SLA report and timing records for the same run.

The server times a request from its arrival at the router to its first output there; the client
from just before sending to the first SSE chunk it parses. The client's TTFT is therefore the
server's plus the HTTP proxy hop (Serve proxy → router), SSE framing and both event loops'
scheduling delays: never less (up to clock-read jitter), usually by a few to tens of ms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadtest.metrics import ttft
from loadtest.records import RequestRecord

RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-")


def nearest_rank(values: Sequence[float], p: float) -> float | None:
    """The cluster's percentile (nearest rank, no interpolation), so both sides use one definition."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def tenant_agreement(records: Sequence[RequestRecord], server_sla: dict) -> dict[str, dict]:
    """Per tenant: request counts and TTFT p50/p95/p99 as the client and the server saw them."""
    server = {g["tenant_id"]: g for g in server_sla.get("tenants", [])}
    out: dict[str, dict] = {}
    for tid in sorted({r.tenant for r in records} | set(server)):
        mine = [r for r in records if r.tenant == tid]
        ok_ttfts = [v for r in mine if r.ok and (v := ttft(r)) is not None]
        theirs = server.get(tid, {})
        out[tid] = {
            "client_requests": len(mine),
            "server_requests": theirs.get("requests", 0),
            "client_ok": sum(1 for r in mine if r.ok),
            "server_ok": theirs.get("ok", 0),
            "client_rejected": sum(1 for r in mine if r.rejected),
            "server_rejected": theirs.get("rejected", 0),
        } | {
            f"{side}_ttft_p{p}": value
            for p in (50, 95, 99)
            for side, value in (
                ("client", nearest_rank(ok_ttfts, p)),
                ("server", theirs.get("ttft_s", {}).get(f"p{p}")),
            )
        }
    return out


def server_request_id(response_id: str | None) -> str | None:
    if response_id is None:
        return None
    for prefix in RESPONSE_ID_PREFIXES:
        if response_id.startswith(prefix):
            return response_id[len(prefix) :]
    return response_id


def ttft_deltas(records: Sequence[RequestRecord], server_timings: dict) -> list[float]:
    """Client TTFT − server TTFT of each request both sides timed (matched by response id)."""
    server = {t["request_id"]: t for t in server_timings.get("records", [])}
    deltas = []
    for r in records:
        match = server.get(server_request_id(r.server_id) or "")
        mine = ttft(r)
        if match is not None and match.get("ttft") is not None and mine is not None:
            deltas.append(mine - match["ttft"])
    return deltas
