"""Property tests of the fair queue, serving loop modelled as batches of capacity M tokens.

Each round: requests arriving in that round are pushed; a batch is filled with ``pop_next(cap)``
(``cap`` = M minus the sizes already in the batch, size = prompt + max_tokens; each pop charges the
reservation prompt + 2 × max_tokens); the batch then decodes one token per running request per
step until all finish, and each request is settled (``settle``) when it ends: unproduced output
refunded, cached prompt tokens at the configured discount. Service ``W`` counts what tenants
receive: the prompt (cached tokens at the discount) when the batch starts, 2 per output token as
produced.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenancy import FairQueue, FairShareSettings, QueuedRequest, TenantPolicy
from tests.tenancy.helpers import FakeClock

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIERS = {0: (1.0, True), 1: (5.0, True), 2: (60.0, False)}  # tier -> (TTFT target, may preempt)


@dataclass(frozen=True)
class Req:
    tenant: str
    prompt: int
    max_tokens: int
    output: int
    round: int
    cached: int = 0


@dataclass
class Trace:
    policies: dict[str, TenantPolicy]
    requests: list[Req]
    l_in: int
    m: int
    cached_cost: float = 0.1
    served: list[str] = field(default_factory=list)
    service: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    events: list[tuple[dict[str, int], dict[str, float], frozenset[str]]] = field(default_factory=list)


@st.composite
def traces(
    draw: st.DrawFn,
    tiers: tuple[int, ...] = (1,),
    weights: tuple[float, ...] = (1.0,),
    max_round: int = 12,
    exact: bool = False,
) -> Trace:
    """``exact``: every request produces its max_tokens and nothing is cached (no refunds)."""
    l_in = draw(st.integers(1, 48))
    m = draw(st.integers(l_in + 16, 160))
    policies: dict[str, TenantPolicy] = {}
    for tier in tiers:
        for i in range(draw(st.integers(2, 4))):
            ttft, preempt = TIERS[tier]
            weight = draw(st.sampled_from(weights))
            policies[f"t{tier}-{i}"] = TenantPolicy(weight, tier, f"c{tier}", ttft, preempt)
    reqs = []
    for tid in policies:
        for _ in range(draw(st.integers(1, 25))):
            max_tokens = draw(st.integers(1, 16))
            prompt = draw(st.integers(0, l_in))
            output = max_tokens if exact else draw(st.integers(0, max_tokens))
            cached = 0 if exact else draw(st.integers(0, prompt))
            reqs.append(Req(tid, prompt, max_tokens, output, draw(st.integers(0, max_round)), cached))
    cached_cost = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    return Trace(policies, reqs, l_in, m, cached_cost)


def run(trace: Trace, seconds_per_round: float = 0.4) -> FairQueue:
    clock = FakeClock(0.0)
    settings = FairShareSettings(max_queue_per_tenant=1000, cached_prompt_token_cost=trace.cached_cost)
    q = FairQueue(trace.policies, settings, clock)
    ids = itertools.count()
    by_id: dict[str, Req] = {}
    pending = sorted(trace.requests, key=lambda r: r.round)

    def record() -> None:
        backlogged = frozenset(t for t, s in q.snapshot().tenants.items() if s.queued)
        counters = {t: q.counter(t) for t in trace.policies}
        trace.events.append((dict(trace.service), counters, backlogged))

    for rnd in itertools.count():
        while pending and pending[0].round <= rnd:
            req, rid = pending.pop(0), f"r{next(ids)}"
            by_id[rid] = req
            q.push(q.make_request(rid, req.tenant, req.prompt, req.max_tokens))
            record()
        batch: list[QueuedRequest] = []
        cap = trace.m
        while (item := q.pop_next(cap)) is not None:
            batch.append(item)
            cap -= item.size
            trace.served.append(item.request_id)
            req = by_id[item.request_id]
            trace.service[item.tenant_id] += req.prompt - (1 - trace.cached_cost) * req.cached
            record()
        left = {r.request_id: by_id[r.request_id].output for r in batch}
        items = {r.request_id: r for r in batch}

        def settle_finished(left: dict[str, int] = left, items: dict[str, QueuedRequest] = items) -> None:
            for rid in [r for r, n in left.items() if n == 0]:
                del left[rid]
                q.settle(items[rid], by_id[rid].output, by_id[rid].cached)
                record()

        settle_finished()
        while left:
            for rid in list(left):
                left[rid] -= 1
                trace.service[by_id[rid].tenant] += 2
                record()
            settle_finished()
        clock.advance(seconds_per_round)
        if not pending and not len(q):
            return q
    raise AssertionError("unreachable")


def max_gap_while_backlogged(trace: Trace, f: str, g: str) -> tuple[float, float]:
    """Largest |ΔW_f − ΔW_g| over intervals where both stay backlogged, and largest |c_f − c_g| then."""
    worst_service = worst_counter = 0.0
    lo = hi = None
    for service, counters, backlogged in trace.events:
        if f in backlogged and g in backlogged:
            d = service.get(f, 0) - service.get(g, 0)
            lo, hi = (d, d) if lo is None else (min(lo, d), max(hi, d))
            worst_service = max(worst_service, hi - lo)
            worst_counter = max(worst_counter, abs(counters[f] - counters[g]))
        else:
            lo = hi = None
    return worst_service, worst_counter


def check_same_tier_bound(trace: Trace, exact: bool = False) -> None:
    """docs/tenancy.md: |c_f − c_g| <= 2(S + M)/w (2S/w without refunds), |ΔW_f − ΔW_g| <= 4S + 8M,
    with S the largest request size and M the batch's token capacity."""
    s = max(r.prompt + r.max_tokens for r in trace.requests)
    refunds = 0 if exact else trace.m
    for f, g in itertools.combinations(trace.policies, 2):
        pf, pg = trace.policies[f], trace.policies[g]
        if pf.tier != pg.tier or pf.weight != pg.weight:
            continue
        service_gap, counter_gap = max_gap_while_backlogged(trace, f, g)
        assert service_gap <= 4 * s + 8 * trace.m + 1e-9, (f, g, service_gap)
        assert counter_gap <= 2 * (s + refunds) / pf.weight + 1e-9, (f, g, counter_gap, s, exact)


@SETTINGS
@given(traces(max_round=0))
def test_bound_all_backlogged_from_start(trace: Trace) -> None:
    run(trace)
    check_same_tier_bound(trace)


@SETTINGS
@given(traces(max_round=12))
def test_bound_with_random_arrivals(trace: Trace) -> None:
    run(trace)
    check_same_tier_bound(trace)


@SETTINGS
@given(traces(tiers=(0, 1, 2), max_round=12))
def test_bound_within_each_tier_despite_deadline_jumps(trace: Trace) -> None:
    run(trace, seconds_per_round=0.7)
    check_same_tier_bound(trace)


@SETTINGS
@given(traces(tiers=(0, 1, 2), max_round=12, exact=True))
def test_without_refunds_counters_stay_within_one_request(trace: Trace) -> None:
    run(trace, seconds_per_round=0.7)
    check_same_tier_bound(trace, exact=True)


@SETTINGS
@given(traces(tiers=(0, 2), weights=(1.0, 2.0, 3.0), max_round=12))
def test_no_request_lost_or_served_twice(trace: Trace) -> None:
    q = run(trace)
    assert len(trace.served) == len(set(trace.served)) == len(trace.requests)
    assert len(q) == 0 and q.pop_next() is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["push", "pop", "remove", "charge"]), st.integers(0, 5)), max_size=120)
)
def test_random_operations_keep_every_request_exactly_once(ops: list[tuple[str, int]]) -> None:
    policies = {f"t{i}": TenantPolicy(1.0 + i, i % 2, f"c{i % 2}", 1.0, True) for i in range(3)}
    clock = FakeClock(0.0)
    q = FairQueue(policies, FairShareSettings(), clock)
    pushed: list[str] = []
    out: list[str] = []
    for n, (op, arg) in enumerate(ops):
        clock.advance(0.3)
        tenant_id = f"t{arg % 3}"
        if op == "push":
            q.push(q.make_request(f"r{n}", tenant_id, arg * 3, arg + 1))
            pushed.append(f"r{n}")
        elif op == "pop" and (item := q.pop_next(capacity=arg * 4)) is not None:
            assert item.size <= arg * 4
            out.append(item.request_id)
        elif op == "remove" and pushed:
            removed = q.remove(pushed[arg % len(pushed)])
            if removed is not None:
                out.append(removed.request_id)
        elif op == "charge":
            q.charge(tenant_id, arg)
        assert len(q) == len(pushed) - len(out)
    while (item := q.pop_next()) is not None:
        out.append(item.request_id)
    assert sorted(out) == sorted(pushed) and len(out) == len(set(out))


def test_weighted_shares_converge_to_weights() -> None:
    weights = {"w1": 1.0, "w2": 2.0, "w4": 4.0}
    policies = {t: TenantPolicy(w, 1, "c1", 5.0, True) for t, w in weights.items()}
    reqs = [Req(t, 20, 20, 20, 0) for t in weights for _ in range(900)]
    trace = Trace(policies, reqs, l_in=20, m=200)
    run(trace)
    # compare shares over the prefix where all three are still backlogged
    service, _, _ = next(e for e in trace.events[::-1] if len(e[2]) == 3)
    total = sum(service.values())
    for t, w in weights.items():
        assert abs(service[t] / total - w / sum(weights.values())) < 0.01, (t, service)
    normalized = [service[t] / w for t, w in weights.items()]
    assert max(normalized) - min(normalized) <= 2 * 2 * trace.m


@SETTINGS
@given(traces(tiers=(0, 1, 2), max_round=6), st.integers(1, 3), st.data())
def test_eligible_pops_the_smallest_counter_of_its_tier_among_eligible(
    trace: Trace, cap: int, data: st.DataObject
) -> None:
    """The dispatcher's per-tenant cap: tenants holding ``cap`` running requests are skipped; each
    pop still goes to the smallest counter of its tier among eligible backlogged tenants (property
    (S) of the proof, over the tenants that may take the slot), is charged its reservation, and
    raises the tier floor; skipped requests are served later, none lost or doubled."""
    clock = FakeClock(0.0)
    q = FairQueue(trace.policies, FairShareSettings(max_queue_per_tenant=1000), clock)
    ids = itertools.count()
    for req in sorted(trace.requests, key=lambda r: r.round):
        q.push(q.make_request(f"r{next(ids)}", req.tenant, req.prompt, req.max_tokens))
    running: dict[str, list[QueuedRequest]] = defaultdict(list)
    served: list[str] = []
    while len(q) or any(running.values()):
        clock.advance(data.draw(st.sampled_from([0.0, 0.3, 1.1])))
        eligible = {t for t in trace.policies if len(running[t]) < cap}
        snap = q.snapshot()
        before = {t: s.counter for t, s in snap.tenants.items()}
        item = q.pop_next(eligible=eligible.__contains__)
        if item is None:
            assert all(not snap.tenants[t].queued for t in eligible if t in snap.tenants)
        else:
            tier = trace.policies[item.tenant_id].tier
            rivals = [
                c
                for t, c in before.items()
                if t in eligible and snap.tenants[t].queued and trace.policies[t].tier == tier
            ]
            assert item.tenant_id in eligible and before[item.tenant_id] == min(rivals)
            assert q._tiers[tier].floor >= before[item.tenant_id]
            reserved = (item.prompt_tokens + 2 * item.max_tokens) / trace.policies[item.tenant_id].weight
            assert abs(q.counter(item.tenant_id) - before[item.tenant_id] - reserved) < 1e-9
            running[item.tenant_id].append(item)
            served.append(item.request_id)
        if item is None or data.draw(st.booleans()):  # a running request ends
            busy = [t for t, rs in running.items() if rs]
            if busy:
                done = running[data.draw(st.sampled_from(sorted(busy)))].pop(0)
                q.settle(done, data.draw(st.integers(0, done.max_tokens)))
    assert len(served) == len(set(served)) == len(trace.requests)
