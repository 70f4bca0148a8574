"""One simulated run: a trace, a policy, a cluster → outcomes, service samples, replica-seconds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from loadtest.sim.autoscaler import Autoscaler
from loadtest.sim.events import EventLoop
from loadtest.sim.outcomes import Outcomes, ServiceSampler
from loadtest.sim.pool import ReplicaPool
from loadtest.sim.queues import make_queue
from loadtest.sim.replica import ReplicaSpec
from loadtest.sim.replica_choice import make_chooser
from loadtest.sim.router import NoReserveDispatcher, SimRouter
from loadtest.sim.spec import ClusterSpec, PolicySpec
from loadtest.sim.step_model import StepModel
from loadtest.sim.workload import Trace
from tenancy import MemoryQuotaStore, QuotaManager, TenancyConfig


@dataclass(slots=True)
class RunResult:
    policy: PolicySpec
    outcomes: Outcomes
    sampler: ServiceSampler
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
) -> RunResult:
    from cluster.routing.dispatcher import Dispatcher

    started = time.perf_counter()
    loop = EventLoop()
    outcomes, sampler = Outcomes(len(trace)), ServiceSampler(len(trace.tenants))
    queue = make_queue(policy.queue, config, loop.clock)
    dispatcher_cls = Dispatcher if policy.reserved_room else NoReserveDispatcher
    dispatcher = dispatcher_cls(queue, cluster.replica_room, 1, 0, cluster.queue_timeout_s)
    quotas = None
    if policy.quotas:
        quotas = QuotaManager(config, MemoryQuotaStore(clock=loop.clock), clock=loop.clock)
    chooser = make_chooser(policy.choice)
    spec = ReplicaSpec(
        step,
        cluster.kv_blocks,
        cluster.block_size,
        cluster.max_num_seqs,
        cluster.max_num_batched_tokens,
        cluster.join_lag_steps,
    )
    holder: list[SimRouter] = []
    a = cluster.autoscaling

    def replicas_changed(n: int) -> None:
        chooser.refresh(pool.ready)
        dispatcher.set_replicas(n)

    pool = ReplicaPool(
        loop,
        spec,
        lambda job, now: holder[0].finished(job, now),
        replicas_changed,
        a.replica_start_s if a else 0.0,
    )
    router = SimRouter(
        loop,
        trace,
        quotas,
        dispatcher,
        chooser,
        pool,
        outcomes,
        sampler,
        cluster.replica_room + 8,
        cluster.queue_timeout_s,
        cluster.dispatch_latency_s,
        cluster.client_latency_s,
    )
    holder.append(router)
    initial = cluster.replicas if a is None else (a.initial_replicas or a.min_replicas)
    pool.add(initial, immediately=True)
    last_arrival = float(trace.arrival[-1]) if len(trace) else 0.0
    autoscaler = None
    if a is not None:
        autoscaler = Autoscaler(loop, pool, a, lambda: loop.now < last_arrival or router.in_system > 0)
        autoscaler.start()
    _periodic(
        loop,
        cluster.routing_stats_period_s,
        lambda: chooser.refresh(pool.ready),
        lambda: loop.now <= last_arrival or router.in_system > 0,
    )
    _periodic(
        loop,
        sample_interval_s,
        lambda: sampler.sample(loop.now),
        lambda: loop.now <= last_arrival or router.in_system > 0,
    )
    _feed(loop, trace, router)
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


def _feed(loop: EventLoop, trace: Trace, router: SimRouter, chunk: int = 4096) -> None:
    """Arrivals enter the heap a chunk at a time, so the heap holds only near-future events."""
    arrival = trace.arrival.tolist()

    def feed(start: int) -> None:
        stop = min(start + chunk, len(arrival))
        for i in range(start, stop):
            loop.at(arrival[i], router.arrive, i)
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
