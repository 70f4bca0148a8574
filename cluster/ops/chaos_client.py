"""The client side of the chaos drills: streamed requests with a record of how each one ended, and
the server's own counters (``fairlane_requests_total``) read back from ``/metrics``.

Both sides are reduced to the same four endings so they can be compared: completed, rejected,
errored, aborted. A request is *sent* once and must end exactly once on each side.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

ENDINGS = ("completed", "rejected", "errored", "aborted")
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions")
# The router's outcome labels, mapped to the client's endings.
SERVER_ENDING = {
    "ok": "completed",
    "rejected": "rejected",
    "invalid": "rejected",
    "error": "errored",
    "timeout": "errored",
    "aborted": "aborted",
}


@dataclass(slots=True)
class ClientRecord:
    """One request as the client saw it."""

    tenant: str
    user: str | None = None  # sent as OpenAI's ``user``: finds the request's timing record in its router
    ending: str = "errored"
    status: int | None = None
    code: str | None = None
    tokens: int = 0
    retry_after: str | None = None
    started: float = field(default_factory=time.monotonic)
    answered: float = 0.0  # the response's status line and headers arrived
    first_token: float = 0.0  # the first token's event arrived (0: none did)
    ended: float = 0.0

    @property
    def latency(self) -> float:
        return self.ended - self.started


def tally(records: list[ClientRecord]) -> dict[str, int]:
    """Sent and each ending, from the client's records."""
    counts = Counter(r.ending for r in records)
    return {"sent": len(records), **{e: counts.get(e, 0) for e in ENDINGS}}


async def stream_chat(
    client: httpx.AsyncClient,
    tenant: str,
    key: str,
    body: dict,
    drop_after_tokens: int | None = None,
) -> ClientRecord:
    """POST a streamed chat completion; drop the connection after ``drop_after_tokens`` content
    chunks (0: as soon as the headers arrive). Cancelling the task also drops it (aborted)."""
    return await fill_record(ClientRecord(tenant), client, key, body, drop_after_tokens)


async def fill_record(
    rec: ClientRecord, client: httpx.AsyncClient, key: str, body: dict, drop_after_tokens: int | None
) -> ClientRecord:
    """``stream_chat`` into a record the caller holds (it survives a cancelled task as "aborted")."""
    body = body | {"stream": True} | ({"user": rec.user} if rec.user else {})
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=_auth(key)) as resp:
            rec.status, rec.answered = resp.status_code, time.monotonic()
            if resp.status_code != 200:
                await _refused(rec, resp)
                return rec
            await _read_events(rec, resp, drop_after_tokens)
    except asyncio.CancelledError:
        rec.ending = "aborted"
        raise
    except httpx.HTTPError as exc:
        rec.ending, rec.code = "errored", type(exc).__name__
    finally:
        rec.ended = time.monotonic()
    return rec


async def _refused(rec: ClientRecord, resp: httpx.Response) -> None:
    body = await resp.aread()
    rec.retry_after = resp.headers.get("retry-after")
    try:
        rec.code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        rec.code = f"http_{resp.status_code}"
    # Refusals that ask the client to come back: over quota or queue (429), or a draining router (503).
    refused = resp.status_code == 429 or (resp.status_code == 503 and rec.code == "draining")
    rec.ending = "rejected" if refused else "errored"


async def _read_events(rec: ClientRecord, resp: httpx.Response, drop_after: int | None) -> None:
    if drop_after == 0:
        rec.ending = "aborted"
        return
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            rec.ending = "completed"
            return
        event = json.loads(data)
        if "error" in event:  # an explicit error event ends a started stream
            rec.ending, rec.code = "errored", event["error"].get("code")
            return
        if event.get("choices"):
            rec.tokens += 1
            rec.first_token = rec.first_token or time.monotonic()
            if drop_after is not None and rec.tokens >= drop_after:
                rec.ending = "aborted"  # leaving the block closes the connection mid-stream
                return
    rec.ending, rec.code = "errored", "stream_ended_without_done"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def parse_counters(text: str) -> tuple[str | None, dict[str, int], int]:
    """(router id, endings summed over tenants, retries) from one ``/metrics`` page. The endings
    also hold ``left_unanswered``: clients that left a generation route before any answer started
    (status 499), a figure beside the endings (with or without a tenant's ending of their own)."""
    router, endings, retries = None, Counter(), 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fairlane_router_info":
                router = sample.labels["router"]
            elif sample.name == "fairlane_requests_total":
                endings[SERVER_ENDING.get(sample.labels["outcome"], "errored")] += int(sample.value)
            elif sample.name == "fairlane_retries_total":
                retries += int(sample.value)
            elif sample.name == "fairlane_http_errors_total" and _left_generating(sample.labels):
                endings["left_unanswered"] += int(sample.value)
    return router, dict(endings), retries


def _left_generating(labels: dict[str, str]) -> bool:
    return labels["status"] == "499" and labels["route"] in GENERATION_ROUTES


async def server_counters(
    client: httpx.AsyncClient, routers: int, admin_key: str, max_scrapes: int = 60
) -> dict:
    """Every router's counters (the proxy sends each scrape to one router: scrape until all answered).
    /metrics answers operators only: the admin key reads it."""
    seen: dict[str, tuple[dict[str, int], int]] = {}
    for _ in range(max_scrapes):
        resp = await client.get("/metrics", headers=_auth(admin_key))
        resp.raise_for_status()
        router, endings, retries = parse_counters(resp.text)
        if router is not None:
            seen[router] = (endings, retries)
        if len(seen) >= routers:
            break
    if len(seen) < routers:
        raise RuntimeError(f"saw {len(seen)} of {routers} routers on /metrics")
    total = {e: sum(v[0].get(e, 0) for v in seen.values()) for e in (*ENDINGS, "left_unanswered")}
    total["retried"] = sum(v[1] for v in seen.values())
    return total


def counter_delta(before: dict, after: dict) -> dict[str, int]:
    """What the server counted between two readings, with ``sent`` as the sum of endings."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in (*ENDINGS, "retried", "left_unanswered")}
    delta["sent"] = sum(delta[e] for e in ENDINGS)
    return delta
