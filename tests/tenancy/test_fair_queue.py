"""Unit tests of the fair queue: VTC order, lifting, SLA tiers, bounds, removal, snapshot."""

from __future__ import annotations

import pytest

from tenancy import (
    FairQueue,
    FairShareSettings,
    InvalidQueueItem,
    QueueFull,
    TenantPolicy,
    UnknownTenantError,
)
from tests.tenancy.helpers import FakeClock, make_config, tenant


def policy(tier: int = 1, weight: float = 1.0, ttft: float = 5.0, preempt: bool = True) -> TenantPolicy:
    return TenantPolicy(
        weight=weight, tier=tier, sla_class=f"c{tier}", ttft_target_s=ttft, may_preempt=preempt
    )


def queue(clock: FakeClock | None = None, **policies: TenantPolicy) -> FairQueue:
    settings = FairShareSettings(
        max_queue_per_tenant=4, max_queue_total=6, at_risk_margin_s=0.0, at_risk_margin_fraction=0.0
    )
    return FairQueue(policies, settings, clock or FakeClock(0.0))


def push(q: FairQueue, tenant_id: str, rid: str, prompt: int = 10, max_tokens: int = 10) -> None:
    q.push(q.make_request(rid, tenant_id, prompt, max_tokens))


def drain(q: FairQueue) -> list[str]:
    out = []
    while (r := q.pop_next()) is not None:
        out.append(r.request_id)
    return out


def test_equal_weights_alternate() -> None:
    q = queue(a=policy(), b=policy())
    for i in range(3):
        push(q, "a", f"a{i}")
    for i in range(3):
        push(q, "b", f"b{i}")
    assert drain(q) == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert q.counter("a") == q.counter("b") == 30.0


def test_weights_scale_service() -> None:
    q = queue(a=policy(weight=2.0), b=policy())
    for i in range(4):
        push(q, "a", f"a{i}")
    for i in range(2):
        push(q, "b", f"b{i}")
    order = drain(q)
    assert order[:3] == ["a0", "b0", "a1"] and order.index("a2") < order.index("b1")


def test_output_is_charged_twice_per_token_over_weight() -> None:
    q = queue(a=policy(weight=4.0))
    q.charge("a", 10)
    assert q.counter("a") == pytest.approx(5.0)
    with pytest.raises(ValueError, match=">= 0"):
        q.charge("a", -1)


def test_returning_tenant_is_lifted_and_banks_no_credit() -> None:
    q = queue(a=policy(), b=policy())
    for i in range(3):
        push(q, "a", f"a{i}")
    q.pop_next()
    q.charge("a", 50)  # a: 10 + 100
    push(q, "b", "b0")  # b idle so far: lifted to a's counter, not left at 0
    assert q.counter("b") == pytest.approx(q.counter("a"))
    assert drain(q) == ["a1", "b0", "a2"]


def test_at_risk_higher_tier_goes_first_within_candidate_tiers() -> None:
    clock = FakeClock(0.0)
    q = queue(clock, fast=policy(tier=0, ttft=1.0), slow=policy(tier=2, ttft=60.0, preempt=False))
    q.charge("fast", 500)  # fast has had far more service: VTC alone would pick slow
    push(q, "slow", "s0")
    push(q, "fast", "f0")
    assert q.peek_next() is not None and q.peek_next().request_id == "s0"
    clock.advance(1.0)  # f0's deadline (arrival + 1 s, zero margin) is reached: at risk
    assert q.pop_next().request_id == "f0"
    assert q.pop_next().request_id == "s0"


def test_class_without_preemption_never_jumps() -> None:
    clock = FakeClock(0.0)
    q = queue(clock, hi=policy(tier=0, ttft=100.0), lax=policy(tier=2, ttft=1.0, preempt=False))
    q.charge("lax", 100)
    push(q, "lax", "l0")
    push(q, "hi", "h0")
    clock.advance(10.0)  # lax's request is long past its deadline but its class may not preempt
    assert drain(q) == ["h0", "l0"]


def test_at_risk_tier_does_not_jump_a_more_urgent_tier() -> None:
    clock = FakeClock(0.0)
    q = queue(clock, top=policy(tier=0, ttft=100.0), mid=policy(tier=1, ttft=1.0))
    q.charge("mid", 5)
    push(q, "top", "t0")
    push(q, "mid", "m0")
    clock.advance(5.0)  # mid at risk: candidates are tiers <= 1, VTC among them -> top (counter 0)
    assert drain(q) == ["t0", "m0"]


def test_capacity_blocks_instead_of_skipping_the_fair_choice() -> None:
    q = queue(a=policy(), b=policy())
    push(q, "a", "big", prompt=100, max_tokens=100)
    push(q, "b", "small", prompt=1, max_tokens=1)
    assert q.pop_next(capacity=50) is None
    assert len(q) == 2
    assert q.pop_next(capacity=200).request_id == "big"
    assert q.pop_next(capacity=2).request_id == "small"
    assert q.pop_next() is None


def test_bounds_raise_queue_full() -> None:
    q = queue(a=policy(), b=policy())
    for i in range(4):
        push(q, "a", f"a{i}")
    with pytest.raises(QueueFull) as info:
        push(q, "a", "a4")
    assert info.value.scope == "tenant" and info.value.limit == 4 and info.value.status_code == 429
    push(q, "b", "b0")
    push(q, "b", "b1")
    with pytest.raises(QueueFull) as info:
        push(q, "b", "b2")
    assert info.value.scope == "total" and info.value.limit == 6
    assert len(q) == 6


def test_remove_head_and_middle() -> None:
    q = queue(a=policy(), b=policy())
    for i in range(3):
        push(q, "a", f"a{i}")
    push(q, "b", "b0")
    assert q.remove("a0").request_id == "a0"
    assert q.remove("a1").request_id == "a1"
    assert q.remove("a1") is None and q.remove("zzz") is None
    assert "a2" in q and "a0" not in q
    assert drain(q) == ["a2", "b0"]
    assert len(q) == 0


def test_invalid_items() -> None:
    q = queue(a=policy())
    push(q, "a", "x")
    with pytest.raises(InvalidQueueItem, match="already queued"):
        push(q, "a", "x")
    with pytest.raises(UnknownTenantError):
        q.make_request("y", "nobody", 1, 1)
    bad = q.make_request("z", "a", 1, 1)
    with pytest.raises(InvalidQueueItem, match="tier"):
        q.push(type(bad)(**{**{f: getattr(bad, f) for f in bad.__slots__}, "tier": 7}))


def test_snapshot_and_from_config() -> None:
    config = make_config(tenant("acme", sla="interactive", weight=2), tenant("init", sla="batch"))
    clock = FakeClock(0.0)
    q = FairQueue.from_config(config, clock)
    push(q, "acme", "r1")
    push(q, "acme", "r2")
    push(q, "init", "r3")
    q.pop_next()
    snap = q.snapshot()
    assert snap.total == 2 == len(q)
    assert snap.depth_by_class == {"interactive": 1, "batch": 1}
    assert snap.depth_by_tier == {0: 1, 2: 1}
    assert snap.tenants["acme"].counter == pytest.approx(5.0) and snap.tenants["acme"].weight == 2
    r = q.make_request("r4", "acme", 1, 1)
    assert (r.sla_class, r.tier, r.deadline - r.arrival) == ("interactive", 0, 1.0)


def test_heaps_stay_small_under_many_charges() -> None:
    q = queue(a=policy(), b=policy())
    push(q, "a", "a0")
    push(q, "b", "b0")
    for _ in range(10_000):
        q.charge("a", 1)
    tier = q._tiers[1]
    assert len(tier.by_counter) <= 4 * tier.backlogged + 64
    assert drain(q) == ["b0", "a0"]
