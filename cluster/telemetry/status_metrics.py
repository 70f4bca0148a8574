"""An ASGI middleware that counts every error answer (status 400 and up) by route and status.

Refusals the request flow records itself (quotas, the fair queue, draining) are also in
``fairlane_requests_total``; this counter sees the rest too: a bad key (401), an unknown model or
route (404), an invalid body (400, 422 for malformed JSON), a body too large (413). A client that
leaves before any answer started (Serve cancels the router's call) counts as 499, nginx's "client
closed request", wherever in the router it was: before auth it is no tenant's request, and only this
counter sees it. Routes are named from a fixed list, so a scanner's random paths add no label values.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

CLIENT_GONE = "499"  # nginx's "client closed request": the client left before any answer started

ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/tenants",
    "/admin",
    "/metrics",
    "/health",
)


def route_of(path: str) -> str:
    """The known route a path belongs to (its prefix), or "other"."""
    return next((route for route in ROUTES if path.endswith(route) or f"{route}/" in path), "other")


class StatusMetrics:
    """Wraps an ASGI app; ``counter()`` is read per request (the router sets it when it starts)."""

    def __init__(self, app: Callable, counter: Callable[[], Counter | None]) -> None:
        self.app = app
        self._counter = counter

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        counter = self._counter() if scope["type"] == "http" else None
        if counter is None:
            await self.app(scope, receive, send)
            return

        started = False

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] >= 400:
                    counter.labels(route_of(scope.get("path", "")), str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except asyncio.CancelledError:  # Serve cancels the call when the client disconnects
            if not started:
                counter.labels(route_of(scope.get("path", "")), CLIENT_GONE).inc()
            raise
