"""Timing records and ledger rows of made-up requests, with known outcomes and latencies."""

from __future__ import annotations

import random
import time
import uuid

from cluster.ledger.rows import LedgerRow, Pricing, row_from_timing
from cluster.telemetry.request_timing import RequestTiming

TENANTS = (("alice", "interactive"), ("bob", "standard"), ("carol", "batch"))
MODELS = ("m-small", "m-large")
PRICING = Pricing(dollars_per_hour=5.0, room=4)


def timings(n: int, seed: int = 7) -> list[RequestTiming]:
    """``n`` closed records ending about now: most ok, some rejected, failed, aborted or invalid."""
    rng = random.Random(seed)
    now = time.monotonic()
    out = []
    for _ in range(n):
        tenant, sla = rng.choice(TENANTS)
        arrival = now - rng.uniform(1, 30)
        t = RequestTiming(
            uuid.uuid4().hex,
            tenant,
            sla,
            arrival,
            prompt_tokens=rng.randint(5, 200),
            model=rng.choice(MODELS),
            key_id=f"key_{tenant}",
        )
        outcome = rng.choices(["ok", "rejected", "error", "aborted", "invalid"], [80, 8, 4, 4, 4])[0]
        t.outcome = outcome  # type: ignore[assignment]
        t.reason = None if outcome == "ok" else f"why-{outcome}"
        if outcome == "rejected" or outcome == "invalid":
            t.end = arrival + 0.001
            out.append(t)
            continue
        t.admitted = arrival + 0.001
        t.dispatched = t.admitted + rng.uniform(0, 0.5)
        t.first_token = t.dispatched + rng.uniform(0.01, 2.0)
        t.output_tokens = rng.randint(1, 64)
        t.cached_tokens = rng.randint(0, t.prompt_tokens)
        t.end = t.first_token + t.output_tokens * rng.uniform(0.005, 0.2)
        t.itl_p99 = rng.uniform(0.005, 0.3)
        out.append(t)
    return out


def rows(n: int, app: str = "app", router: str = "r1", seed: int = 7) -> list[LedgerRow]:
    return [row_from_timing(t, app, router, PRICING) for t in timings(n, seed)]
