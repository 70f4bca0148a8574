"""Within one tier, fairlane pops in vtc's order: deadlines, sparse-flow jumps and other tiers decide
*when* a tier is served, never *which* of its tenants goes next (docs/tenancy.md, issue 23: the
simulator's gap excess over vtc is not an ordering difference inside the batch tier)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tenancy import FairQueue, FairShareSettings
from tests.tenancy.helpers import FakeClock
from tests.tenancy.test_fair_queue_properties import SETTINGS, Trace, traces

BATCH = 2


def _push_all(q: FairQueue, trace: Trace, tier: int | None) -> None:
    for n, req in enumerate(trace.requests):
        if tier is None or trace.policies[req.tenant].tier == tier:
            q.push(q.make_request(f"r{n}", req.tenant, req.prompt, req.max_tokens))


@SETTINGS
@given(traces(tiers=(0, 1, BATCH), max_round=0), st.data())
def test_a_tier_is_served_in_vtc_order_whatever_the_jumps(trace: Trace, data: st.DataObject) -> None:
    clock = FakeClock(0.0)
    settings = FairShareSettings(max_queue_per_tenant=1000)
    fairlane = FairQueue(trace.policies, settings, clock, "fairlane")
    _push_all(fairlane, trace, None)
    served: list[str] = []
    while len(fairlane):
        clock.advance(data.draw(st.sampled_from([0.0, 0.1, 0.5, 2.0])))  # heads turn at risk
        item = fairlane.pop_next()
        assert item is not None
        if item.tier == BATCH:
            served.append(item.request_id)
    batch = {t: p for t, p in trace.policies.items() if p.tier == BATCH}
    vtc = FairQueue(batch, settings, FakeClock(0.0), "vtc")
    _push_all(vtc, trace, BATCH)
    alone = [item.request_id for item in iter(vtc.pop_next, None)]
    assert served == alone  # every batch request, once, in the same order
