"""How a request that failed before or while streaming is recorded: its outcome and reason."""

from __future__ import annotations

import asyncio

from cluster.errors import BadRequest, ClusterError, ReplicaFailure, ServiceUnavailable
from cluster.telemetry.request_timing import Outcome
from tenancy import QueueFull, QuotaExceeded, RequestLimitExceeded


class ClientGone(Exception):
    """The client closed its connection while its answer was being written."""


def outcome_of(exc: BaseException) -> tuple[Outcome, str | None]:
    if isinstance(exc, QuotaExceeded):
        return "rejected", exc.reason
    if isinstance(exc, QueueFull):
        return "rejected", f"queue_full_{exc.scope}"
    if isinstance(exc, RequestLimitExceeded | BadRequest):
        return "invalid", getattr(exc, "limit", None) or getattr(exc, "code", None)
    if isinstance(exc, asyncio.CancelledError | GeneratorExit | ClientGone):
        return "aborted", "client_gone"
    if isinstance(exc, ServiceUnavailable):
        return ("timeout" if exc.code and "timeout" in exc.code else "error"), exc.code
    return "error", type(exc).__name__


def replica_timeout() -> ServiceUnavailable:
    """No output within the token timeout (pulled and pushed streams alike)."""
    return ServiceUnavailable("the replica did not answer in time", code="replica_timeout")


def stream_failure(exc: Exception) -> BaseException:
    """What a failed replica stream raises: typed errors as they are, anything else (the replica
    died, or Serve could not route) as a failure the client may retry."""
    if isinstance(exc, ClusterError):
        return exc
    return ReplicaFailure(f"replica failure: {type(exc).__name__}")
