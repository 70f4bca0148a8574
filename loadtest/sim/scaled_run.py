"""One simulated run with a scaler of the caller's choice (one router): ``simulation.simulate``'s
pieces (the real router, dispatcher and fair queue, the replica pool), with the autoscaler made by
``make_scaler`` (Serve's count policy, the SLA policy, or none for a fixed count). The pool's size is
sampled every ``timeline_s`` for the report."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from loadtest.sim.events import EventLoop
from loadtest.sim.outcomes import BacklogSampler, Outcomes
from loadtest.sim.pool import ReplicaPool
from loadtest.sim.replica import Job, ReplicaSpec
from loadtest.sim.router import SimRouter
from loadtest.sim.simulation import RunResult, _feed, _periodic, _router
from loadtest.sim.spec import ClusterSpec, PolicySpec
from loadtest.sim.step_model import StepModel
from loadtest.sim.workload import Trace
from tenancy import TenancyConfig


class Scaler(Protocol):
    decisions: list[tuple[float, int]]

    def start(self) -> None: ...


# (loop, pool, router, outcomes, keep_running) -> a started-later scaler
MakeScaler = Callable[[EventLoop, ReplicaPool, SimRouter, Outcomes, Callable[[], bool]], Scaler]


def simulate_scaled(
    trace: Trace,
    config: TenancyConfig,
    policy: PolicySpec,
    cluster: ClusterSpec,
    step: StepModel,
    initial: int,
    start_s: float,
    make_scaler: MakeScaler | None,
    timeline_s: float = 30.0,
) -> tuple[RunResult, Scaler | None, list[tuple[float, int]]]:
    """The run, the scaler (None for a fixed count) and the (time, ready + starting) samples."""
    started = time.perf_counter()
    loop = EventLoop()
    outcomes, sampler = Outcomes(len(trace)), BacklogSampler(len(trace.tenants))
    spec = ReplicaSpec.of_cluster(step, cluster)
    routers: list[SimRouter] = []

    def replicas_changed(n: int) -> None:
        for r in routers:
            r.replicas_changed(pool.ready, n)

    def finished(job: Job, now: float) -> None:
        routers[0].finished(job, now)

    pool = ReplicaPool(loop, spec, finished, replicas_changed, start_s)
    routers.append(_router(loop, trace, config, policy, cluster, None, pool, outcomes, sampler))
    pool.add(initial, immediately=True)
    last_arrival = float(trace.arrival[-1]) if len(trace) else 0.0

    def busy() -> bool:
        return loop.now < last_arrival or routers[0].in_system > 0

    def running() -> bool:
        return loop.now <= last_arrival or routers[0].in_system > 0

    scaler = make_scaler(loop, pool, routers[0], outcomes, busy) if make_scaler else None
    if scaler is not None:
        scaler.start()
    timeline: list[tuple[float, int]] = []
    _periodic(loop, cluster.routing_stats_period_s, lambda: routers[0].refresh_stats(pool.ready), running)
    _periodic(loop, timeline_s, lambda: timeline.append((loop.now, pool.target)), running)
    _feed(loop, trace, routers[0].arrive)
    loop.run()
    end = float(np.nanmax(outcomes.end)) if len(trace) else 0.0
    loop.now = end
    pool.close()
    run = RunResult(
        policy,
        outcomes,
        sampler,
        pool.replica_seconds,
        end,
        loop.events_run,
        time.perf_counter() - started,
        pool.peak,
        scaler.decisions if scaler else [],
    )
    return run, scaler, timeline
