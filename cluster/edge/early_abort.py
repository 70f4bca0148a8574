"""A request whose client leaves after auth and before admission: recorded as aborted.

Serve's proxy cancels the router's handler when the client disconnects. Past auth the request is
the tenant's (a ledger row, a count in ``fairlane_requests_total``), but until ``RequestRunner.open``
runs, nothing would record it: templating and tokenizing a long prompt on a busy router take
long enough for a client's timer to fire. Recorded here, every request the router authenticated
ends exactly once, as what it was (aborted, client_gone), like one that leaves while it waits.
"""

from __future__ import annotations

import time

from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import RequestTiming, TimingRecorder
from tenancy import Tenant


def record_client_gone(
    recorder: TimingRecorder,
    metrics: ClusterMetrics,
    request_id: str,
    tenant: Tenant,
    model: str,
    key_id: str = "",
    received: float | None = None,
) -> RequestTiming:
    """Record the request as aborted by its client before admission; the record it added."""
    now = time.monotonic()
    timing = RequestTiming(
        request_id,
        tenant.id,
        tenant.sla_class,
        now,
        end=now,
        outcome="aborted",
        reason="client_gone",
        model=model,
        key_id=key_id,
        received=received,
    )
    recorder.add(timing)  # and the ledger's row, through the recorder's sink
    metrics.observe_end(timing)
    return timing
