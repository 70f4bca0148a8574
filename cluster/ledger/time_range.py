"""The time range of a ledger report: ``from`` / ``to`` as ISO 8601 or unix seconds, checked."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from cluster.errors import BadRequest

MAX_RANGE_DAYS = 400  # a year and a month: a yearly invoice's range, nothing that scans for ever
BUCKETS = {"1h": 3600, "1d": 86400}


@dataclass(frozen=True, slots=True)
class TimeRange:
    """[start, end) in unix seconds."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def parse_instant(value: str, param: str) -> float:
    """Unix seconds from ``1733011200``, ``1733011200.5`` or ISO 8601 (no zone: UTC); else a 400."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            seconds = parsed.timestamp()
        except (ValueError, OverflowError):  # not a date, or one past what a timestamp holds
            raise BadRequest(
                f"{param}: {value!r} is neither ISO 8601 nor unix seconds", code="invalid_time", param=param
            ) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise BadRequest(f"{param}: {value!r} is not a time", code="invalid_time", param=param)
    return seconds


def time_range(query: Mapping[str, str], default_start: float, now: float) -> TimeRange:
    """The range a report's query asks for: ``from`` (default ``default_start``) to ``to`` (default
    now). A start not before the end, or a range over ``MAX_RANGE_DAYS``, is a 400."""
    start = parse_instant(query["from"], "from") if "from" in query else default_start
    end = parse_instant(query["to"], "to") if "to" in query else now
    if end <= start:
        raise BadRequest("from must be before to", code="invalid_time_range", param="from")
    if end - start > MAX_RANGE_DAYS * 86400:
        raise BadRequest(
            f"the range is over {MAX_RANGE_DAYS} days; ask for less", code="time_range_too_large", param="to"
        )
    return TimeRange(start, end)


def bucket_width(query: Mapping[str, str]) -> int:
    """Seconds per usage bucket from ``bucket_width`` (``1h`` or ``1d``, OpenAI's names; default 1d)."""
    name = query.get("bucket_width", "1d")
    if name not in BUCKETS:
        raise BadRequest(
            f"bucket_width: {name!r} is not one of {sorted(BUCKETS)}",
            code="invalid_bucket",
            param="bucket_width",
        )
    return BUCKETS[name]
