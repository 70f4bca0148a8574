"""Inter-token latency of one stream: the gaps between its output items, per token.

Outputs carry several tokens (a stream channel flush, at most 20 ms; or a Serve stream's
``stream_interval_s`` with ``stream_channel`` off), so an output of k tokens after a gap g counts as
k gaps of g / k: what a reader of the stream sees per token on average within the output.
"""

from __future__ import annotations

import math


class InterTokenGaps:
    """Collects (gap per token, tokens) after the first item; ``p99`` at the end."""

    __slots__ = ("_gaps", "_last")

    def __init__(self) -> None:
        self._gaps: list[tuple[float, int]] = []
        self._last: float | None = None

    def add(self, now: float, tokens: int) -> None:
        """An item of ``tokens`` new tokens read at ``now`` (monotonic seconds)."""
        if tokens <= 0:
            return
        if self._last is not None:
            self._gaps.append(((now - self._last) / tokens, tokens))
        self._last = now

    def percentile(self, p: float) -> float | None:
        """Nearest-rank percentile over every token's gap (the SLA report's rule); None before two items."""
        if not self._gaps:
            return None
        ordered = sorted(self._gaps)
        rank = max(1, math.ceil(p / 100 * sum(n for _, n in ordered)))
        seen = 0
        for gap, n in ordered:
            seen += n
            if seen >= rank:
                return gap
        return ordered[-1][0]
