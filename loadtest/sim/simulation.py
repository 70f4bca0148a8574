"""One simulated run: a trace, a policy, a cluster → outcomes, backlog samples, replica-seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from loadtest.sim.autoscaler import Autoscaler
from loadtest.sim.events import EventLoop
from loadtest.sim.multi_router import router_picker, start_counter_exchange, tenant_picker
from loadtest.sim.outcomes import BacklogSampler, Outcomes
from loadtest.sim.pool import ReplicaPool
from loadtest.sim.queues import make_queue
from loadtest.sim.replica import Job, ReplicaSpec
from loadtest.sim.replica_choice import make_chooser
from loadtest.sim.router import SimRouter
from loadtest.sim.spec import ClusterSpec, PolicySpec
from loadtest.sim.step_model import StepModel
from loadtest.sim.workload import Trace
from tenancy import MemoryQuotaStore, QuotaManager, TenancyConfig


@dataclass(slots=True)
class RunResult:
    policy: PolicySpec
    outcomes: Outcomes
    sampler: BacklogSampler
    replica_seconds: float
    end_time: float
    events: int
    wall_s: float
    peak_replicas: int
    scale_decisions: list[tuple[float, int]] = field(default_factory=list)


def simulate(
    trace: Trace,
    config: TenancyConfig,
    policy: PolicySpec,
    cluster: ClusterSpec,
    step: StepModel,
    sample_interval_s: float = 5.0,
    assign: Callable[[int], int] | None = None,
) -> RunResult:
    """``assign(i)``: the router request ``i`` reaches (tests); default ``cluster.router_choice``."""
    started = time.perf_counter()
    loop = EventLoop()
    outcomes, sampler = Outcomes(len(trace)), BacklogSampler(len(trace.tenants))
    # One quota store for every router: the cluster's Redis store, so bounds hold across routers.
    store = MemoryQuotaStore(clock=loop.clock) if policy.quotas else None
    spec = ReplicaSpec.of_cluster(step, cluster)
    routers: list[SimRouter] = []
    owner = np.zeros(len(trace), dtype=np.int8)  # the router that holds request i
    a = cluster.autoscaling

    def replicas_changed(n: int) -> None:
        for r in routers:
            r.replicas_changed(pool.ready, n)

    def finished(job: Job, now: float) -> None:
        routers[owner[job.rid]].finished(job, now)

    pool = ReplicaPool(loop, spec, finished, replicas_changed, a.replica_start_s if a else 0.0)
    routers += [
        _router(loop, trace, config, policy, cluster, store, pool, outcomes, sampler)
        for _ in range(cluster.routers)
    ]
    initial = cluster.replicas if a is None else (a.initial_replicas or a.min_replicas)
    pool.add(initial, immediately=True)
    last_arrival = float(trace.arrival[-1]) if len(trace) else 0.0

    def busy() -> bool:
        return loop.now < last_arrival or any(r.in_system > 0 for r in routers)

    def running() -> bool:
        return loop.now <= last_arrival or any(r.in_system > 0 for r in routers)

    autoscaler = None
    if a is not None:
        autoscaler = Autoscaler(loop, pool, a, busy)
        autoscaler.start()
    _periodic(
        loop, cluster.routing_stats_period_s, lambda: [r.refresh_stats(pool.ready) for r in routers], running
    )
    _periodic(loop, sample_interval_s, lambda: sampler.sample(loop.now), running)
    if len(routers) > 1:
        queues = [r.queue for r in routers]
        start_counter_exchange(loop, queues, cluster.counter_sync_s, running, cluster.share_lifts)
    _feed(loop, trace, _arrivals(routers, owner, cluster, assign, trace.tenant))
    loop.run()
    end = float(np.nanmax(outcomes.end)) if len(trace) else 0.0  # periodic ticks may run past it
    loop.now = end
    sampler.sample(end)
    pool.close()
    return RunResult(
        policy,
        outcomes,
        sampler,
        pool.replica_seconds,
        end,
        loop.events_run,
        time.perf_counter() - started,
        pool.peak,
        autoscaler.decisions if autoscaler else [],
    )


def _router(
    loop: EventLoop,
    trace: Trace,
    config: TenancyConfig,
    policy: PolicySpec,
    cluster: ClusterSpec,
    store: MemoryQuotaStore | None,
    pool: ReplicaPool,
    outcomes: Outcomes,
    sampler: BacklogSampler,
) -> SimRouter:
    """One router: its own fair queue, dispatcher (its share of the room) and replica choice."""
    from cluster.routing.dispatcher import Dispatcher

    queue = make_queue(policy.dispatch, config, loop.clock)
    # No displacing dispatch: a simulated replica admits in arrival order and preempts no tier.
    dispatcher = Dispatcher(
        queue, cluster.replica_room, cluster.routers, 0, cluster.queue_timeout_s, displace=False
    )
    quotas = None if store is None else QuotaManager(config, store, clock=loop.clock)
    return SimRouter(
        loop,
        trace,
        quotas,
        dispatcher,
        make_chooser(policy.choice),
        pool,
        outcomes,
        sampler,
        cluster.replica_room + 8,
        cluster.queue_timeout_s,
        cluster.dispatch_latency_s,
        cluster.client_latency_s,
    )


def _arrivals(
    routers: list[SimRouter],
    owner: np.ndarray,
    cluster: ClusterSpec,
    assign: Callable[[int], int] | None,
    tenant_of: np.ndarray,
) -> Callable[[int], None]:
    """Request i reaches one router (one router: straight to it, no draw)."""
    if len(routers) == 1 and assign is None:
        return routers[0].arrive
    if assign is None:
        assign = _router_choice(routers, cluster, tenant_of)

    def arrive(i: int) -> None:
        k = assign(i)
        owner[i] = k
        routers[k].arrive(i)

    return arrive


def _router_choice(
    routers: list[SimRouter], cluster: ClusterSpec, tenant_of: np.ndarray
) -> Callable[[int], int]:
    """Request i -> its router. ``tenant_two`` needs the request's tenant; the others draw blind
    (``router_picker``, its draw sequence unchanged, so earlier runs repeat)."""
    if cluster.router_choice == "tenant_two":
        by_tenant, tenants = tenant_picker(routers), tenant_of.tolist()
        return lambda i: by_tenant(tenants[i])
    choose = router_picker(cluster.router_choice, routers)
    return lambda _: choose()


def _feed(loop: EventLoop, trace: Trace, arrive: Callable[[int], None], chunk: int = 4096) -> None:
    """Arrivals enter the heap a chunk at a time, so the heap holds only near-future events."""
    arrival = trace.arrival.tolist()

    def feed(start: int) -> None:
        stop = min(start + chunk, len(arrival))
        for i in range(start, stop):
            loop.at(arrival[i], arrive, i)
        if stop < len(arrival):
            loop.at(arrival[stop - 1], feed, stop)

    if arrival:
        loop.at(arrival[0], feed, 0)


def _periodic(loop: EventLoop, period: float, action, keep_going) -> None:
    def tick() -> None:
        action()
        if keep_going():
            loop.after(period, tick)

    loop.at(0.0, tick)
