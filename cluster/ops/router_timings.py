"""A drill request's timing record in the router that served it, found by the OpenAI ``user`` the
drill's client sent (``ClientRecord.user``): where the router saw its time go.

Behind Serve's proxy each ``GET /admin/timings`` reaches one router, picked per call, so the
records are gathered over several calls until every request asked for is found (or the tries end).
"""

from __future__ import annotations

import httpx

from cluster.ops.chaos_drills import Target

TRIES_PER_ROUTER = 8
# The router's stamps, in order (field, name): each stage runs from the stamp before it.
STAGES = (
    ("received", "received"),
    ("arrival", "parsed"),
    ("admitted", "admitted"),
    ("dispatched", "dispatched"),
    ("first_token", "first_token"),
)


async def router_records(client: httpx.AsyncClient, target: Target, users: set[str]) -> dict[str, dict]:
    """Each named ``user``'s timing record, from whichever router holds it."""
    headers = {"Authorization": f"Bearer {target.admin_key}"}
    found: dict[str, dict] = {}
    for _ in range(TRIES_PER_ROUTER * target.routers):
        if users <= found.keys():
            break
        records = (await client.get("/admin/timings", headers=headers)).json()["records"]
        found |= {r["user"]: r for r in records if r.get("user") in users}
    return found


def admission_s(timing: dict) -> float | None:
    """Parsed to admitted: the quota check (Redis, or the local share while it is away)."""
    if timing.get("admitted") is None:
        return None
    return timing["admitted"] - timing["arrival"]


def stage_summary(timing: dict | None) -> str:
    """Seconds per stage from the HTTP entry, then the engine's own queue and first-token times."""
    if timing is None:
        return "not found"
    parts, prev = [], None
    for field, name in STAGES:
        at = timing.get(field)
        if at is not None:
            parts.append(f"{name} +{0.0 if prev is None else at - prev:.3f}")
            prev = at
    engine = f"engine queue {timing.get('engine_queue')}, engine ttft {timing.get('engine_ttft')}"
    return "; ".join([*parts, engine, str(timing.get("outcome"))])
