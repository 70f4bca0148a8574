"""What a tenant may read about itself: its SLA report and usage, never another tenant's.

A tenant id in the path or query that is not the caller's own gets 404, the same answer as for a
tenant that does not exist, so a key cannot be used to discover who else is served here.
"""

from __future__ import annotations

import time
from collections import Counter

from cluster.errors import NotFound
from cluster.telemetry.request_timing import RequestTiming, TimingRecorder
from cluster.telemetry.sla_report import build_report
from tenancy import TenancyConfig, Tenant

QUERY_KEYS = ("tenant", "tenant_id")


def check_own(tenant: Tenant, path_id: str, query: dict[str, str]) -> None:
    """404 unless every tenant id named in the path or query is the caller's ("me" is an alias)."""
    named = [path_id] + [query[k] for k in QUERY_KEYS if k in query]
    if any(n not in ("me", tenant.id) for n in named):
        raise NotFound("no such tenant", code="tenant_not_found", param="tenant_id")


def sla_report(recorder: TimingRecorder, config: TenancyConfig, tenant_id: str | None) -> dict:
    """The SLA report over this router's records, of one tenant (or all, for the admin)."""
    records = [r for r in recorder.records() if tenant_id is None or r.tenant_id == tenant_id]
    window = time.monotonic() - recorder.started
    # A tenant's report holds only its own records: a model's cost is the admin's view alone.
    seconds = recorder.model_replica_seconds if tenant_id is None else None
    return build_report(records, config, window, recorder.replica_seconds, seconds).to_dict()


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
