"""How a request that failed before or while streaming is recorded: its outcome and reason."""

from __future__ import annotations

import asyncio

from cluster.errors import BadRequest, ServiceUnavailable
from cluster.telemetry.request_timing import Outcome
from tenancy import QueueFull, QuotaExceeded, RequestLimitExceeded


def outcome_of(exc: BaseException) -> tuple[Outcome, str | None]:
    if isinstance(exc, QuotaExceeded):
        return "rejected", exc.reason
    if isinstance(exc, QueueFull):
        return "rejected", f"queue_full_{exc.scope}"
    if isinstance(exc, RequestLimitExceeded | BadRequest):
        return "invalid", getattr(exc, "limit", None) or getattr(exc, "code", None)
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "aborted", "client_gone"
    if isinstance(exc, ServiceUnavailable):
        return ("timeout" if exc.code and "timeout" in exc.code else "error"), exc.code
    return "error", type(exc).__name__
