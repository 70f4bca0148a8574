"""The drain's bound (loadtest/drain.py) from hand-made records: the longest answer still owed at the
run's own TPOT, the first-token allowance only while a request has no first token, the cap."""

from __future__ import annotations

import pytest

from loadtest.drain import SLOWEST_TPOT_S, TPOT_MARGIN, drain_bound
from loadtest.records import RequestRecord
from loadtest.scenario import Scenario
from tests.loadtest.trace import rec


def scenario(**kw) -> Scenario:
    tenant = {"id": "a", "api_key": "k", "sla_class": "standard", "rate": 1.0}
    return Scenario.model_validate({"name": "d", "duration_s": 10.0, "tenants": [tenant]} | kw)


def still_open(max_tokens: int, first_token: float | None = None) -> RequestRecord:
    r = rec("a", 9.0, (first_token,) if first_token is not None else ())
    r.end, r.max_tokens, r.status = None, max_tokens, "cut"
    return r


def test_streaming_requests_get_their_longest_answer_at_twice_the_measured_tpot() -> None:
    done = [rec("a", 0.0, (0.5, 0.6, 0.7)), rec("a", 1.0, (1.5, 1.7, 1.9))]  # TPOT 0.1 and 0.2
    records = [*done, still_open(100, first_token=9.5), still_open(300, first_token=9.8)]
    b = drain_bound(records, scenario())
    p99 = 0.1 + 0.99 * 0.1
    assert b.per_token_source == "measured" and b.per_token_s == pytest.approx(TPOT_MARGIN * p99)
    assert (b.open_requests, b.longest_answer, b.first_token_s) == (2, 300, 0.0)
    assert b.seconds == pytest.approx(300 * TPOT_MARGIN * p99) and not b.capped


def test_a_request_without_its_first_token_adds_the_first_token_allowance() -> None:
    records = [still_open(50), still_open(20, first_token=9.5)]  # nothing completed: the assumed pace
    b = drain_bound(records, scenario(first_token_timeout_s=30.0))
    assert b.per_token_source == "assumed" and b.per_token_s == SLOWEST_TPOT_S
    assert b.seconds == pytest.approx(30.0 + 50 * SLOWEST_TPOT_S)


def test_the_cap_bounds_it_and_nothing_open_means_no_wait() -> None:
    capped = drain_bound([still_open(50)], scenario(drain_timeout_s=2.0))
    assert capped.capped and capped.seconds == 2.0 and capped.uncapped_s > 2.0
    assert drain_bound([rec("a", 0.0, (0.5,))], scenario()).seconds == 0.0
