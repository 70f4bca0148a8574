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
    assert q.counter("a") == q.counter("b") == 3 * (10 + 2 * 10)  # each pop reserves prompt + 2 × max


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
    push(q, "fast", "f1")
    # f0 made fast backlogged again (a sparse flow): its tier goes first, as if at risk
    assert q.pop_next().request_id == "f0"
    assert q.peek_next() is not None and q.peek_next().request_id == "s0"  # f1 waits its turn
    clock.advance(1.0)  # f1's deadline (arrival + 1 s, zero margin) is reached: at risk
    assert q.pop_next().request_id == "f1"
    assert q.pop_next().request_id == "s0"


def test_a_returning_tenant_jumps_only_lower_tiers_and_only_from_its_tier_top() -> None:
    q = queue(a=policy(tier=0, ttft=5.0), b=policy(tier=0, ttft=5.0), low=policy(tier=1))
    push(q, "low", "l0")
    push(q, "a", "a0")
    q.pop_next()  # a0: fresh a goes before low
    q.charge("a", 100)
    push(q, "b", "b0")  # b returns, lifted to the tier-0 level; fresh
    push(q, "a", "a1")  # a returns too, but its counter is above b's: b is the tier's top
    assert drain(q) == ["b0", "a1", "l0"]


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
    # total full (6): b, with 2 waiting, pushes out the newest of a's 4
    assert q.push(q.make_request("b2", "b", 10, 10)).request_id == "a3"
    assert "a3" not in q and len(q) == 6
    with pytest.raises(QueueFull) as info:  # now 3 and 3: nobody is pushed out for b
        push(q, "b", "b3")
    assert info.value.scope == "total" and info.value.limit == 6
    with pytest.raises(QueueFull):  # nor for a, the longest lane itself
        push(q, "a", "a5")
    assert len(q) == 6 and drain(q) == ["a0", "b0", "a1", "b1", "a2", "b2"]


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
    assert (
        snap.tenants["acme"].counter == pytest.approx((10 + 2 * 10) / 2) and snap.tenants["acme"].weight == 2
    )
    r = q.make_request("r4", "acme", 1, 1)
    assert (r.sla_class, r.tier, r.deadline - r.arrival) == ("interactive", 0, 1.0)


def test_heaps_stay_small_under_many_charges() -> None:
    q = queue(a=policy(), b=policy())
    push(q, "a", "a0")
    push(q, "b", "b0")
    for _ in range(10_000):
        q.charge("a", 1)
    tier = q._tiers[1]
    assert len(tier.by_order) <= 4 * tier.backlogged + 64
    assert drain(q) == ["b0", "a0"]


def test_settle_refunds_unproduced_output_and_discounts_cached_prompt_tokens() -> None:
    q = queue(a=policy(weight=2.0))
    push(q, "a", "a0", prompt=100, max_tokens=50)
    item = q.pop_next()
    assert q.counter("a") == pytest.approx((100 + 2 * 50) / 2)
    q.settle(item, output_tokens=20, cached_tokens=80)
    # 100 prompt tokens of which 80 cached at 0.1 each, 20 output tokens at 2 each, over weight 2
    assert q.counter("a") == pytest.approx((20 + 80 * 0.1 + 2 * 20) / 2)
    with pytest.raises(ValueError):
        q.settle(item, output_tokens=-1)


def test_cached_prompt_token_cost_is_configurable() -> None:
    settings = FairShareSettings(cached_prompt_token_cost=0.5)
    q = FairQueue({"a": policy()}, settings, FakeClock(0.0))
    q.push(q.make_request("a0", "a", 10, 0))
    q.settle(q.pop_next(), output_tokens=0, cached_tokens=1000)  # cached beyond the prompt: capped
    assert q.counter("a") == pytest.approx(10 * 0.5)


def test_eligible_skips_a_tenant_and_charges_the_one_chosen() -> None:
    q = queue(a=policy(), b=policy())
    push(q, "a", "a0")
    push(q, "b", "b0")
    push(q, "a", "a1")
    assert q.peek_next().tenant_id == "a"
    item = q.pop_next(eligible=lambda t: t != "a")
    assert item.request_id == "b0" and q.counter("b") == 30.0 and q.counter("a") == 0.0
    assert q._tiers[1].floor == 0.0  # raised to b's counter before its charge, as any pop
    assert q.pop_next(eligible=lambda t: t != "a") is None and len(q) == 2
    assert drain(q) == ["a0", "a1"]  # the skipped entries are still there


def test_eligible_ignores_an_at_risk_head_of_a_skipped_tenant() -> None:
    clock = FakeClock(0.0)
    q = queue(clock, hot=policy(tier=0, ttft=1.0), calm=policy(tier=0, ttft=1.0), low=policy(tier=1))
    push(q, "low", "l0")
    push(q, "hot", "h0")
    clock.advance(2.0)  # h0 at risk: tier 0 only, while hot may dispatch
    assert q.peek_next().request_id == "h0"
    assert q.pop_next(eligible=lambda t: t != "hot").request_id == "l0"


def test_fcfs_and_vtc_orderings_on_the_same_code() -> None:
    policies = {"hot": policy(tier=0, ttft=1.0), "low": policy(tier=2, preempt=False)}
    orders = {}
    for order in ("fcfs", "vtc", "fairlane"):
        clock = FakeClock(0.0)
        q = FairQueue(policies, FairShareSettings(), clock, order)
        for i in range(3):
            q.push(q.make_request(f"l{i}", "low", 10, 10))
        clock.advance(0.9)  # the interactive request arrives at risk
        q.push(q.make_request("h0", "hot", 10, 10))
        orders[order] = drain(q)
    assert orders["fcfs"] == ["l0", "l1", "l2", "h0"]  # arrival order
    assert orders["vtc"] == ["l0", "h0", "l1", "l2"]  # lifted to the smallest counter; no jump
    assert orders["fairlane"] == ["h0", "l0", "l1", "l2"]  # at risk: its tier goes first
    with pytest.raises(ValueError):
        FairQueue(policies, order="lifo")  # type: ignore[arg-type]
