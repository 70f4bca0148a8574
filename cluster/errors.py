"""One mapping from every exception to the OpenAI error body and its HTTP status."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from replica.errors import InvalidRequestError
from tenancy import AuthenticationError, QueueFull, QuotaExceeded, RequestLimitExceeded, TenancyError

log = logging.getLogger(__name__)


class ClusterError(Exception):
    """An error the cluster raises itself, with its HTTP status and OpenAI type/code."""

    status_code = 500
    error_type = "internal_error"

    def __init__(
        self,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.headers = headers or {}


class BadRequest(ClusterError):
    status_code = 400
    error_type = "invalid_request_error"


class PayloadTooLarge(ClusterError):
    status_code = 413
    error_type = "invalid_request_error"


class ServiceUnavailable(ClusterError):
    """No replica answered in time, or a wait timed out (503, retry later)."""

    status_code = 503
    error_type = "service_unavailable"


class ReplicaFailure(ServiceUnavailable):
    """The replica died, or Serve could not reach one: retried when no token was sent yet."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="replica_error")


class Draining(ServiceUnavailable):
    """The router is shutting down: it admits nothing new (503 with Retry-After)."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            "the server is shutting down; retry on another instance",
            code="draining",
            headers={"retry-after": str(max(1, retry_after_s))},
        )


class NotFound(ClusterError):
    status_code = 404
    error_type = "invalid_request_error"


class Forbidden(ClusterError):
    status_code = 403
    error_type = "permission_error"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def classify(exc: BaseException) -> ErrorInfo:
    """The status, OpenAI error type/code and headers of any exception."""
    if isinstance(exc, ClusterError):
        return ErrorInfo(exc.status_code, str(exc), exc.error_type, exc.code, exc.param, exc.headers)
    if isinstance(exc, RequestValidationError | ValidationError):
        return _validation(exc)
    if isinstance(exc, AuthenticationError):
        return ErrorInfo(401, str(exc), "authentication_error", "invalid_api_key")
    if isinstance(exc, QuotaExceeded):
        return ErrorInfo(429, str(exc), "rate_limit_exceeded", exc.reason, headers=dict(exc.headers))
    if isinstance(exc, QueueFull):
        retry = {"retry-after": str(max(1, math.ceil(exc.retry_after)))}
        return ErrorInfo(429, str(exc), "rate_limit_exceeded", f"queue_full_{exc.scope}", headers=retry)
    if isinstance(exc, RequestLimitExceeded):
        code = "context_length_exceeded" if exc.limit == "max_context_length" else exc.limit
        return ErrorInfo(400, str(exc), "invalid_request_error", code)
    if isinstance(exc, InvalidRequestError | ValueError):
        return ErrorInfo(400, str(exc), "invalid_request_error")
    if isinstance(exc, HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return ErrorInfo(exc.status_code, str(exc.detail), kind)
    if isinstance(exc, TenancyError):
        return ErrorInfo(exc.status_code, str(exc), "internal_error")
    log.exception("unhandled error", exc_info=exc)
    return ErrorInfo(500, "internal server error", "internal_error")


def error_body(info: ErrorInfo) -> dict:
    return {"error": {"message": info.message, "type": info.type, "param": info.param, "code": info.code}}


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON response for ``exc``: OpenAI body, status and any rate-limit headers."""
    info = classify(exc)
    return JSONResponse(error_body(info), status_code=info.status, headers=info.headers)


def _validation(exc: RequestValidationError | ValidationError) -> ErrorInfo:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "extra_forbidden":
        return ErrorInfo(
            400,
            f"unrecognized request argument supplied: {param}",
            "invalid_request_error",
            "extra_forbidden",
            param,
        )
    if first.get("type") == "json_invalid":
        msg = "request body is not valid JSON"
    return ErrorInfo(
        400, f"{param}: {msg}" if param else msg, "invalid_request_error", first.get("type"), param
    )
