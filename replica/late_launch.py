"""When to plan the next step: as late as the device allows, so requests that arrive meanwhile join it.

The async loop plans step N+1 while step N runs on the device. Planned as soon as N starts, N+1
takes only the requests that reached the engine before N began: one that arrives during N waits
for N+2, two and a half steps on average before its prefill has run. Planned late, once N has run
its expected device time less what planning, launching and the input copy take, N+1 takes most of
N's arrivals: one and a half steps. A step's tokens are read back when the device ends it either
way, so running requests lose nothing; the wait only moves the next plan later.

The estimate errs short, because a late one leaves the device idle (the profiler's ``gap_ms``):
- a step's device time is the shortest of the recent pure decode steps whose decode rows round up
  to the same power of two: a decode step's time hardly moves with its rows inside such a bucket
  (it reads the weights once whatever the rows), and the margin covers the rest;
- a step with prompt work takes longer than a pure decode step of its rows, so the decode figure
  bounds it from below;
- when the engine cannot tell when N began on the device (its previous step had ended before the
  host looked), N's launch time stands in: earlier than the truth.

The loop does not wait while top-tier work waits in the engine already: the next step is full of
it, and nothing that arrives could go ahead of it (replica/engine_core.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

HISTORY = 8  # pure decode steps remembered per bucket of decode rows
BLOCKED_S = 0.0002  # a read back that waited at least this long saw its step end


def device_start(began_at: float, read_started: float, read_done: float) -> float:
    """When the device began a step launched while the previous one still ran: as that one ended,
    if the loop's read of it waited (from `read_started` to `read_done`); else no later than
    `began_at`, when the loop began planning the step."""
    return read_done if read_done - read_started >= BLOCKED_S else began_at


def rows_bucket(num_decode: int) -> int:
    """Decode rows rounded up to a power of two (graph sizes and step times group by it)."""
    return 1 << max(0, num_decode - 1).bit_length()


@dataclass
class LateLaunch:
    """Learns step times from the profiler's records and says until when the loop may wait."""

    margin_ms: float = 1.0
    _compute_ms: dict[int, deque[float]] = field(default_factory=dict)
    _host_ms: float = 0.0  # the last step's schedule + prepare + launch time on the host
    _h2d_ms: float = 0.0  # the last step's input copy (it must land before the next step can start)

    def observe(
        self, num_decode: int, num_prefill_tokens: int, compute_ms: float, host_ms: float, h2d_ms: float
    ) -> None:
        """A step read back: its host cost always, its device time when it was pure decode."""
        self._host_ms, self._h2d_ms = host_ms, h2d_ms
        if num_prefill_tokens == 0 and num_decode > 0:
            seen = self._compute_ms.setdefault(rows_bucket(num_decode), deque(maxlen=HISTORY))
            seen.append(compute_ms)

    def expected_compute_ms(self, num_decode: int) -> float | None:
        """The device time a step of `num_decode` decode rows will take at least, if known."""
        seen = self._compute_ms.get(rows_bucket(num_decode))
        return min(seen) if seen else None

    def deadline(self, started: float | None, num_decode: int) -> float | None:
        """The clock time (seconds, the caller's clock) until which the loop may wait before
        planning the step after one that began on the device at `started`; None: plan at once."""
        if started is None:
            return None
        compute = self.expected_compute_ms(num_decode)
        if compute is None:
            return None
        slack_ms = compute - self._host_ms - self._h2d_ms - self.margin_ms
        return started + slack_ms / 1000.0 if slack_ms > 0 else None
