"""Typed errors of the tenancy layer. The router maps each to an HTTP status (see ``status_code``)."""

from __future__ import annotations

import math
from typing import Literal

QuotaReason = Literal["rpm", "tpm", "concurrency", "daily_budget"]
QueueScope = Literal["tenant", "total", "wait"]


class TenancyError(Exception):
    """Base class of every error raised by ``tenancy``."""

    status_code: int = 500


class TenancyConfigError(TenancyError, ValueError):
    """The tenancy configuration is invalid; ``problems`` lists ``"field.path: message"`` lines."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message if not problems else f"{message}:\n  " + "\n  ".join(problems))
        self.problems = problems


class KeySaltError(TenancyError, ValueError):
    """The key salt is missing or too short to key the API-key HMAC (its value is never in the message)."""


class AuthenticationError(TenancyError):
    """Missing or unknown API key (HTTP 401). The key itself is never part of the message."""

    status_code = 401

    def __init__(self, reason: Literal["missing", "invalid"]) -> None:
        super().__init__(f"authentication failed: {reason} API key")
        self.reason = reason


class UnknownTenantError(TenancyError, KeyError):
    """A tenant id that the configuration does not define (a programming error upstream)."""

    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"unknown tenant {tenant_id!r}")
        self.tenant_id = tenant_id


class QuotaExceeded(TenancyError):
    """A rate or concurrency quota refused the request (HTTP 429).

    ``retry_after`` is in seconds; ``headers`` holds the six OpenAI ``x-ratelimit-*`` headers plus
    ``retry-after`` (whole seconds, rounded up), ready to attach to the response.
    """

    status_code = 429

    def __init__(
        self, tenant_id: str, reason: QuotaReason, retry_after: float, headers: dict[str, str]
    ) -> None:
        super().__init__(f"tenant {tenant_id!r} is over its {reason} quota; retry after {retry_after:.3f}s")
        self.tenant_id = tenant_id
        self.reason: QuotaReason = reason
        self.retry_after = retry_after
        self.headers = headers


class RequestLimitExceeded(TenancyError):
    """One request is larger than a per-request limit allows (HTTP 400); ``limit`` names the limit."""

    status_code = 400

    def __init__(self, tenant_id: str, limit: str, value: int, maximum: int) -> None:
        super().__init__(f"request of tenant {tenant_id!r} exceeds {limit}: {value} > {maximum}")
        self.tenant_id = tenant_id
        self.limit = limit
        self.value = value
        self.maximum = maximum


class QueueFull(TenancyError):
    """The waiting queue is full for this tenant (``scope="tenant"``) or overall (``"total"``), or
    its backlog would outlast the wait bound (``"wait"``, ``QueueWaitTooLong``) (HTTP 429)."""

    status_code = 429

    def __init__(
        self, tenant_id: str, scope: QueueScope, limit: int, retry_after: float = 1.0, message: str = ""
    ) -> None:
        super().__init__(message or f"queue full ({scope} limit {limit}) for tenant {tenant_id!r}")
        self.tenant_id = tenant_id
        self.scope: QueueScope = scope
        self.limit = limit
        self.retry_after = retry_after


class QueueWaitTooLong(QueueFull):
    """The requests ahead of this one would keep it waiting past the queue's time bound: refused now
    with a 429, instead of accepted and answered with a 503 when the bound runs out."""

    def __init__(self, tenant_id: str, expected_wait_s: float, bound_s: float) -> None:
        message = (
            f"tenant {tenant_id!r}'s request would wait about {expected_wait_s:.0f}s for a replica, "
            f"past the queue's {bound_s:g}s bound"
        )
        super().__init__(tenant_id, "wait", math.ceil(bound_s), expected_wait_s - bound_s, message)
        self.expected_wait_s = expected_wait_s


class InvalidQueueItem(TenancyError, ValueError):
    """A request pushed to the fair queue is malformed or already queued (``problem`` says which)."""

    def __init__(self, request_id: str, problem: str) -> None:
        super().__init__(f"request {request_id!r} cannot be queued: {problem}")
        self.request_id = request_id
        self.problem = problem
