"""What a router sent a replica since its last report: counted until a report covers it, then dropped."""

from __future__ import annotations

from cluster.edge.request_ids import new_request_id
from cluster.routing.sent_since_report import FORGET_S, SentSinceReport
from tests.tenancy.helpers import FakeClock


def test_sends_a_report_counts_stop_weighing_but_are_kept_until_forgotten() -> None:
    clock = FakeClock(100.0)
    sent = SentSinceReport(clock)
    for i in range(5):
        sent.chose(f"r{i}", "a", 10.0)
        clock.advance(1.0)
    assert sent.tokens("a", None) == 50.0  # no report yet: every send
    assert sent.tokens("a", 102.5) == 20.0  # the report of 102.5 counts r0..r2
    # Serve may still route a counted request elsewhere: where it was chosen is still known.
    assert [sent.replica_of(f"r{i}") for i in range(5)] == ["a"] * 5
    clock.advance(1.5)  # r0 and r1 are older than FORGET_S now
    assert sent.tokens("a", 102.5) == 20.0
    assert [sent.replica_of(f"r{i}") for i in range(5)] == [None, None, "a", "a", "a"]
    assert len(sent._by_replica["a"]) == 3


def test_old_sends_are_forgotten_and_a_moved_send_still_counts() -> None:
    clock = FakeClock(100.0)
    sent = SentSinceReport(clock)
    sent.chose("old", "a", 7.0)
    clock.advance(1.0)
    sent.chose("x", "b", 5.0)
    sent.routed("old", "b")  # Serve sent it to b, behind a newer send there
    assert sent.tokens("b", 99.0) == 12.0
    clock.advance(FORGET_S)  # "old" is past the horizon, "x" is not yet
    assert sent.tokens("b", None) == 5.0
    clock.advance(1.0)
    assert sent.tokens("b", None) == 0.0


def test_request_ids_are_unique_and_shaped_like_uuid4_hex() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
