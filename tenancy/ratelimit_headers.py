"""OpenAI-style ``x-ratelimit-*`` headers.

Reset values are durations in the form OpenAI sends (Go duration style): ``"20ms"`` below one
second, otherwise hours/minutes/seconds with up to three decimals of seconds, e.g. ``"1s"``,
``"8.64s"``, ``"6m0s"``, ``"1h2m3s"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateLimitState:
    """Limits and what is left of them after a decision, for the response headers."""

    requests_limit: int
    requests_remaining: int
    requests_reset_s: float
    tokens_limit: int
    tokens_remaining: int
    tokens_reset_s: float


def format_reset(seconds: float) -> str:
    """Format a duration like OpenAI's reset headers."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    millis = math.ceil(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(state: RateLimitState, retry_after: float | None = None) -> dict[str, str]:
    """The six ``x-ratelimit-*`` headers, plus ``retry-after`` (whole seconds, rounded up) if given."""
    headers = {
        "x-ratelimit-limit-requests": str(state.requests_limit),
        "x-ratelimit-remaining-requests": str(max(0, state.requests_remaining)),
        "x-ratelimit-reset-requests": format_reset(state.requests_reset_s),
        "x-ratelimit-limit-tokens": str(state.tokens_limit),
        "x-ratelimit-remaining-tokens": str(max(0, state.tokens_remaining)),
        "x-ratelimit-reset-tokens": format_reset(state.tokens_reset_s),
    }
    if retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(retry_after)))
    return headers
