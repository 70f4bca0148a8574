from __future__ import annotations

import pytest

from tenancy import RateLimitState, format_reset, ratelimit_headers


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.0171, "18ms"),
        (1, "1s"),
        (8.64, "8.64s"),
        (59.9991, "1m0s"),
        (360, "6m0s"),
        (88.8, "1m28.8s"),
        (3723, "1h2m3s"),
        (-5, "0ms"),
    ],
)
def test_format_reset_like_openai(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_headers_never_show_negative_remaining() -> None:
    state = RateLimitState(10, -2, 12.0, 1000, -50, 0.5)
    headers = ratelimit_headers(state, retry_after=0.2)
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"] == "500ms"
    assert headers["retry-after"] == "1"
    assert "retry-after" not in ratelimit_headers(state)
