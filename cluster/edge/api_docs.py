"""What each route may answer, declared in the OpenAPI schema so that clients and the fuzzing suite
(``tests/faults/test_fuzz_api.py``) can check every response against it.

Every error is the OpenAI body ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The OpenAI error body."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": _WHY[s]} for s in statuses}


_WHY = {
    400: "Invalid request (body, parameters or limits).",
    401: "Missing or invalid API key.",
    403: "The key may not use this route.",
    404: "Unknown model, tenant or route.",
    413: "Request body over the size limit.",
    429: "Over quota or waiting queue full (Retry-After, x-ratelimit-*).",
    503: "No replica in time, draining, or a wait timed out (Retry-After when draining).",
}

_JSON_OR_SSE = {
    200: {
        "description": "The completion, or a server-sent-event stream when stream=true.",
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
    }
}

GENERATE = _JSON_OR_SSE | _errors(400, 401, 404, 413, 429, 503)
TENANT = _errors(400, 401, 404, 413)
ADMIN = _errors(400, 401, 403, 404, 413)
_JSON: dict[str, Any] = {"application/json": {}}
RELOAD = {
    200: {"description": "Every running router applies the new version.", "content": _JSON},
    202: {"description": "Published; some routers did not report it in time (partial).", "content": _JSON},
} | ADMIN
PUBLIC = _errors(400, 404, 413)
HEALTH = {
    200: {"description": "Serving (status ok or degraded).", "content": {"application/json": {}}},
    503: {"description": "No replica or draining.", "content": {"application/json": {}}},
} | _errors(400, 404, 413)
METRICS = {200: {"description": "Prometheus text format.", "content": {"text/plain": {}}}} | _errors(
    400, 401, 403, 404, 413
)
