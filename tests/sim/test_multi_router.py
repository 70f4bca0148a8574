"""Several routers in the simulator: one router is the old run bit for bit; with the counter exchange
two equal-weight backlogged tenants on different routers get equal service; quotas hold across routers."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from loadtest.sim.multi_router import router_picker, tenant_picker
from loadtest.sim.outcomes import OK, QUOTA
from loadtest.sim.runner import find_scenario
from loadtest.sim.simulation import RunResult, simulate
from loadtest.sim.spec import POLICIES, ClusterSpec, ScaleSpec
from loadtest.sim.step_model import load_step_model
from loadtest.sim.tenants import tenancy_config
from loadtest.sim.workload import build_trace
from tests.sim.conftest import make_config, make_trace


def _digest(run: RunResult) -> str:
    h = hashlib.sha256()
    o = run.outcomes
    for a in (o.status, o.dispatched, o.first_token, o.end, o.output, o.replica, *run.sampler.arrays()):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr((run.events, run.replica_seconds, run.end_time)).encode())
    return h.hexdigest()[:16]


# Digests of these runs at commit bd27ee4, before the simulator had several routers. They change
# only if the queue, dispatcher or replica model changes on purpose: then recompute them there.
# Recomputed when the sampler stopped sampling the queue's dispatch-time charges (issue 41; the gap is
# over settled service, from the outcomes): at d7d4fdc the code gave bd27ee4's digests with that array
# (5608dbba…, f0e6be7d…, 9de6c5e6…) and these without it, so the runs themselves are unchanged.
BEFORE_ROUTERS = {
    "fairlane": "f7f09d6dae123fd8",
    "vtc": "805668f308db21e4",
    "fairlane+quotas": "4cb117e8ff11dbb9",
}


def test_one_router_is_the_run_before_routers_bit_for_bit():
    scale, cluster = ScaleSpec(tenants=40, requests=4000, seed=3), ClusterSpec(replicas=2)
    step = load_step_model(cluster.step_model)
    scenario = find_scenario("platform")
    trace = build_trace(scenario, scale, cluster, step)
    config = tenancy_config(scenario, trace.tenants, scale, cluster, trace.capacity_rps)
    for name, digest in BEFORE_ROUTERS.items():
        assert _digest(simulate(trace, config, POLICIES[name], cluster, step)) == digest, name
    # the sync period means nothing to one router: no exchange runs
    one = cluster.model_copy(update={"routers": 1, "counter_sync_s": 0.05})
    assert _digest(simulate(trace, config, POLICIES["fairlane"], one, step)) == BEFORE_ROUTERS["fairlane"]


PAIR = [("a", "batch", 1.0), ("b", "batch", 1.0)]


def _pair_run(flat_10ms, sync_s: float) -> tuple[int, int]:
    """Both tenants backlogged from 0; a's requests alternate between routers 0 and 1, all of b's
    reach router 0. Each router may hold one request in flight. Dispatches of each before 8 s."""
    rows = [(0.0, 0, 16, 20) for _ in range(200)] + [(0.0, 1, 16, 20) for _ in range(200)]
    trace = make_trace(rows, PAIR)
    seen = {0: 0}

    def assign(i: int) -> int:
        if trace.tenant[i] == 1:
            return 0
        seen[0] += 1
        return seen[0] % 2

    cluster = ClusterSpec.model_validate(
        {"replicas": 1, "kv_blocks": 10_000, "max_num_batched_tokens": 4096, "replica_room": 1}
        | {"routers": 2, "counter_sync_s": sync_s}
    )
    run = simulate(trace, make_config(PAIR), POLICIES["fairlane"], cluster, flat_10ms, assign=assign)
    early = run.outcomes.dispatched < 8.0
    return int((early & (trace.tenant == 0)).sum()), int((early & (trace.tenant == 1)).sum())


def test_the_counter_exchange_evens_out_tenants_on_different_routers(flat_10ms):
    a, b = _pair_run(flat_10ms, sync_s=0.1)
    assert a > 20 and abs(a - b) <= 0.1 * (a + b), (a, b)  # router 0 serves b while a is served on 1
    a, b = _pair_run(flat_10ms, sync_s=1e6)  # no exchange after the start: router 0 splits its slot
    assert a > 2.5 * b, (a, b)


def test_quotas_hold_across_routers(flat_10ms):
    one = [("t0", "interactive", 1.0)]
    trace = make_trace([(0.0, 0, 16, 2)] * 6, one)
    cluster = ClusterSpec.model_validate({"replicas": 1, "routers": 3, "max_num_batched_tokens": 4096})
    run = simulate(
        trace, make_config(one, rpm=3), POLICIES["rate_limits"], cluster, flat_10ms, assign=lambda i: i % 3
    )
    assert sorted(run.outcomes.status.tolist()) == [OK, OK, OK, QUOTA, QUOTA, QUOTA]  # 3 a minute, not 3 each


def test_each_router_holds_its_share_of_the_room(flat_10ms):
    # 1 replica × room 3 over 2 routers: ceil(3/2) = 2 each, as the cluster's dispatcher computes it
    # (fcfs: no room reserved for other tenants)
    one = [("t0", "batch", 1.0)]
    trace = make_trace([(0.0, 0, 16, 50)] * 8, one)
    cluster = ClusterSpec.model_validate(
        {"replicas": 1, "routers": 2, "replica_room": 3, "max_num_batched_tokens": 4096}
    )
    run = simulate(trace, make_config(one), POLICIES["fcfs"], cluster, flat_10ms, assign=lambda i: i % 2)
    assert int((run.outcomes.dispatched == 0.0).sum()) == 4


@pytest.mark.parametrize("choice", ["power_of_two", "random"])
def test_router_choice_spreads_requests(choice):
    class Held:
        def __init__(self, n: int) -> None:
            self.in_system = n

    routers = [Held(0), Held(0), Held(0), Held(100)]
    pick = router_picker(choice, routers, seed=1)
    picks = np.bincount([pick() for _ in range(4000)], minlength=4)
    assert (picks[:3] > 800).all()
    if choice == "power_of_two":
        assert picks[3] == 0  # the busy router loses every draw it is in
    else:
        assert 800 < picks[3] < 1200


class _Lanes:
    """A router as ``tenant_picker`` sees it: requests held, and waiting per tenant."""

    def __init__(self, tenants: int, held: int = 0) -> None:
        self.in_system, self.waiting = held, [0] * tenants


def test_tenant_choice_goes_where_the_tenant_waits_least():
    routers = [_Lanes(2), _Lanes(2, held=50)]
    routers[0].waiting[0] = 3  # tenant 0 waits on router 0 only; the other router holds more
    pick = tenant_picker(routers, seed=1)
    assert {pick(0) for _ in range(50)} == {1}
    assert {pick(1) for _ in range(50)} == {0}  # tenant 1 waits nowhere: the one holding fewer


def test_tenant_choice_keeps_each_tenants_lanes_even():
    """Fed by one burst and never served, every tenant's lanes stay within one request of each other
    with 2 routers (both always compared) and within a few with 4 (two of them drawn)."""
    for n, spread in ((2, 1), (4, 3)):
        routers = [_Lanes(5) for _ in range(n)]
        pick, rng = tenant_picker(routers, seed=2), np.random.default_rng(0)
        for tenant in rng.integers(0, 5, size=2000).tolist():
            k = pick(tenant)
            routers[k].waiting[tenant] += 1
            routers[k].in_system += 1
        lanes = np.array([r.waiting for r in routers])
        assert (lanes.max(axis=0) - lanes.min(axis=0)).max() <= spread, lanes


def test_tenant_choice_in_a_run_leaves_no_one_waiting(flat_10ms, monkeypatch):
    """``tenant_two`` end to end: every request is served, each router's per-tenant waiting count
    returns to zero (arrive, grant and drop keep it), and both tenants use both routers."""
    seen: dict = {"routers": None, "picks": []}

    def recording(routers, seed=0):
        seen["routers"], pick = routers, tenant_picker(routers, seed)
        return lambda tenant: seen["picks"].append((tenant, pick(tenant))) or seen["picks"][-1][1]

    monkeypatch.setattr("loadtest.sim.simulation.tenant_picker", recording)
    rows = [(0.002 * i, i % 2, 16, 20) for i in range(200)]
    trace = make_trace(rows, PAIR)
    cluster = ClusterSpec.model_validate(
        {"replicas": 1, "kv_blocks": 10_000, "max_num_batched_tokens": 4096, "replica_room": 2}
        | {"routers": 2, "router_choice": "tenant_two"}
    )
    run = simulate(trace, make_config(PAIR), POLICIES["fairlane"], cluster, flat_10ms)
    assert int((run.outcomes.status == OK).sum()) == 200
    assert all(not any(r.waiting) for r in seen["routers"])
    assert set(seen["picks"]) == {(0, 0), (0, 1), (1, 0), (1, 1)}
