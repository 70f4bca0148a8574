"""The end of a run: arrivals stop with the load, then every open request is drained to its end.

The drain waits on a condition (every request the run sent has ended), never for a fixed time, so
a run is as long as its slowest answer, and a request still streaming when the load stops is
measured to its last token. A bound keeps a server that never ends a request from holding the run
forever; it is set from the requests still open when the load stops, long enough that no request
the server is still serving reaches it:

    bound = first_token_timeout_s (only if an open request has no first token yet)
            + longest × per_token_s

* ``first_token_timeout_s`` (the scenario's; 180 s by default): how long a request may still wait
  for its first token, in the fair queue behind the load's backlog or in prefill. fairlane ends
  such a request itself after ``queue_timeout_s`` (60 s) + ``first_token_timeout_s`` (120 s).
* ``longest``: the largest ``max_tokens`` among the open requests: the longest answer still owed.
* ``per_token_s``: the run's own TPOT p99 over the requests that completed during the load, × 2
  (as the drain proceeds the batch thins and tokens come faster, not slower; the margin is for a
  slow stretch); with nothing completed yet, 0.1 s a token, the slowest decode fairlane itself
  assumes when it drains a replica (``SLOWEST_DECODE_TOKENS_PER_S`` in ``cluster/config.py``).

A scenario's ``drain_timeout_s``, when set, caps the bound: a capacity rung cuts on purpose, a
benchmark keeps to its time budget. A request still open at the bound is **cut** by the client's own
deadline (status ``cut``, error ``client_deadline``): reported in a column of its own and left out of
every attainment, never counted as an SLA miss (``loadtest/metrics.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from loadtest.metrics import percentiles, tpot
from loadtest.records import CUT_ERROR, RequestRecord
from loadtest.scenario import Scenario

TPOT_MARGIN = 2.0
SLOWEST_TPOT_S = 0.1  # = 1 / cluster.config.SLOWEST_DECODE_TOKENS_PER_S


@dataclass(frozen=True, slots=True)
class DrainBound:
    """The drain's bound as computed when the load stopped, with its parts (``meta.drain``)."""

    seconds: float  # the bound itself (after the cap)
    open_requests: int  # requests not yet ended when the load stopped
    longest_answer: int  # the largest max_tokens among them
    per_token_s: float
    per_token_source: str  # "measured" (TPOT p99 × TPOT_MARGIN) or "assumed" (SLOWEST_TPOT_S)
    first_token_s: float  # the allowance for a request without its first token; 0 when none is
    uncapped_s: float  # the bound before the scenario's drain_timeout_s
    capped: bool  # drain_timeout_s is below the computed bound

    def as_dict(self) -> dict:
        return asdict(self)


def per_token_time(records: Sequence[RequestRecord]) -> tuple[float, str]:
    """Seconds per output token for the bound: the run's TPOT p99 × the margin, or the assumed floor."""
    measured = [v for r in records if r.ok if (v := tpot(r)) is not None]
    p99 = percentiles(measured, (99,))["p99"]
    if p99 is None:
        return SLOWEST_TPOT_S, "assumed"
    return TPOT_MARGIN * p99, "measured"


def drain_bound(records: Sequence[RequestRecord], scenario: Scenario) -> DrainBound:
    """The bound for the requests still open in ``records`` (those without an end) when the load stops."""
    still = [r for r in records if r.end is None]
    longest = max((r.max_tokens for r in still), default=0)
    per_token, source = per_token_time(records)
    waiting = any(r.first_token is None for r in still)
    first = scenario.first_token_timeout_s if waiting else 0.0
    uncapped = first + longest * per_token
    cap = scenario.drain_timeout_s
    capped = cap is not None and cap < uncapped
    return DrainBound(
        seconds=cap if capped else uncapped,  # type: ignore[arg-type]
        open_requests=len(still),
        longest_answer=longest,
        per_token_s=per_token,
        per_token_source=source,
        first_token_s=first,
        uncapped_s=uncapped,
        capped=capped,
    )


def cut_unended(records: Sequence[RequestRecord], now: float) -> None:
    """Mark every record still without an end as cut at ``now``: a request task cancelled before it
    ever ran never reached its own handler (``Runner._one``), and one never sent is reported too."""
    for r in records:
        if r.end is None:
            r.status, r.error, r.end = "cut", CUT_ERROR, now
