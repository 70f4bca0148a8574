"""What a tenant may read about itself: its SLA report and usage, never another tenant's.

A tenant id in the path or query that is not the caller's own gets 404, the same answer as for a
tenant that does not exist, so a key cannot be used to discover who else is served here. A tenant's
cost is what its own requests used, priced as the ledger prices their rows; the cluster's
replica-seconds (every tenant's, and idle time) are the admin's view alone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

from cluster.errors import NotFound
from cluster.ledger.rows import Pricing, row_from_timing
from cluster.telemetry.request_timing import RequestTiming, TimingRecorder
from cluster.telemetry.sla_report import build_report
from tenancy import TenancyConfig, Tenant

QUERY_KEYS = ("tenant", "tenant_id")


def check_own(tenant: Tenant, path_id: str, query: dict[str, str]) -> None:
    """404 unless every tenant id named in the path or query is the caller's ("me" is an alias)."""
    named = [path_id] + [query[k] for k in QUERY_KEYS if k in query]
    if any(n not in ("me", tenant.id) for n in named):
        raise NotFound("no such tenant", code="tenant_not_found", param="tenant_id")


def sla_report(
    recorder: TimingRecorder,
    config: TenancyConfig,
    tenant_id: str | None,
    pricing: Callable[[str], Pricing],
) -> dict:
    """The SLA report over this router's records, of one tenant (or all, for the admin).
    ``pricing``: a model's price and room, as the ledger's rows are priced."""
    window = time.monotonic() - recorder.started
    if tenant_id is None:
        records = recorder.records()
        seconds = recorder.model_replica_seconds
        return build_report(records, config, window, recorder.replica_seconds, seconds).to_dict()
    # A tenant's report holds only its own records, and their cost only: the replicas' seconds are
    # every tenant's (and idle time), which no tenant is shown nor charged; a model's are too.
    records = [r for r in recorder.records() if r.tenant_id == tenant_id]
    return build_report(records, config, window, own_replica_seconds(records, pricing)).to_dict()


def own_replica_seconds(records: Iterable[RequestTiming], pricing: Callable[[str], Pricing]) -> float:
    """The replica-seconds ``records`` held: each finished request's slot from dispatch to end over
    its replica's room, as ``row_from_timing`` prices a ledger row (a refused request held none)."""
    return sum(
        row_from_timing(r, "", "", pricing(r.model)).replica_seconds for r in records if r.end is not None
    )


def usage(records: list[RequestTiming], tenant_id: str) -> dict:
    """Requests by outcome and tokens of one tenant over this router's records."""
    mine = [r for r in records if r.tenant_id == tenant_id]
    outcomes = Counter(r.outcome or "error" for r in mine)
    return {
        "tenant_id": tenant_id,
        "requests": len(mine),
        "outcomes": dict(sorted(outcomes.items())),
        "prompt_tokens": sum(r.prompt_tokens for r in mine if r.outcome != "rejected"),
        "output_tokens": sum(r.output_tokens for r in mine),
    }
