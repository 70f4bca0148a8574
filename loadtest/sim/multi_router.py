"""Several routers: which router an arriving request reaches, and the routers' counter exchange.

* **Which router.** Serve's proxy sends each request to a router replica with its default request
  router, power of two choices: two replicas drawn at random, the one with fewer ongoing requests
  wins (``power_of_two``; a router's ongoing requests are those it holds: waiting in its fair queue
  or in flight to a replica). ``random`` is a plain uniform draw (a Kubernetes Service in front of
  the routers with direct ingress). ``tenant_two`` (opt-in; Serve would need a custom request
  router) compares the request's tenant's waiting requests instead (``tenant_picker``). The sim
  reads the exact counts; Serve's are cached and probed.
* **Counter exchange.** Every ``counter_sync_s`` each router runs ``SharedCounters.sync``'s rule
  (``tenancy/counter_sync.py``: publish the growth its queue charged since the last sync, credit the
  others' growth since) against one in-memory ``CounterTotals`` that applies batches as the Redis
  script does. Routers sync at staggered phases (router ``k`` first at ``k/N`` of the period), as
  independently started monitor loops would.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol

from loadtest.sim.events import EventLoop
from loadtest.sim.spec import RouterChoiceName
from tenancy import FairQueue
from tenancy.counter_sync import CounterTotals, MemoryCounters


class HoldsRequests(Protocol):
    in_system: int


class HoldsTenants(HoldsRequests, Protocol):
    waiting: list[int]  # per tenant index: requests waiting in this router's queue


def router_picker(
    choice: RouterChoiceName, routers: Sequence[HoldsRequests], seed: int = 0
) -> Callable[[], int]:
    """A function returning the index of the router the next request reaches."""
    rng = random.Random(seed)
    n = len(routers)
    if choice == "random":
        return lambda: rng.randrange(n)
    if choice != "power_of_two":
        raise ValueError(f"unknown router choice {choice!r}; known: power_of_two, random")

    def two_choices() -> int:
        a, b = _two_distinct(rng, n)
        return a if routers[a].in_system <= routers[b].in_system else b

    return two_choices


def tenant_picker(routers: Sequence[HoldsTenants], seed: int = 0) -> Callable[[int], int]:
    """``tenant_two``: two routers at random, the one where the arriving request's tenant has fewer
    requests waiting (ties: fewer held). Each tenant's lanes then stay about equally long on every
    router, so they empty together: a tenant backlogged in the cluster is rarely out of work on one
    router (served there less, and lifted on its return as if idle) while it waits on another."""
    rng = random.Random(seed)
    n = len(routers)

    def two_choices(tenant: int) -> int:
        a, b = _two_distinct(rng, n)
        ra, rb = routers[a], routers[b]
        return a if (ra.waiting[tenant], ra.in_system) <= (rb.waiting[tenant], rb.in_system) else b

    return two_choices


def _two_distinct(rng: random.Random, n: int) -> tuple[int, int]:
    """Two different router indices, uniformly (two draws, in this order: earlier runs repeat)."""
    a = rng.randrange(n)
    b = rng.randrange(n - 1)
    return a, b + (b >= a)


def start_counter_exchange(
    loop: EventLoop,
    queues: Sequence[FairQueue],
    period_s: float,
    keep_going: Callable[[], bool],
    share_lifts: bool = False,
) -> CounterTotals:
    """Sync each queue's counters every ``period_s`` through one shared store, at staggered phases
    (``share_lifts``: lifts travel too, as offsets; ``tenancy/shared_lifts.py``)."""
    totals = CounterTotals()
    for k, queue in enumerate(queues):
        _sync_every(
            loop,
            MemoryCounters(totals, f"router-{k}", share_lifts),
            queue,
            period_s,
            k * period_s / len(queues),
            keep_going,
        )
    return totals


def _sync_every(
    loop: EventLoop,
    counters: MemoryCounters,
    queue: FairQueue,
    period_s: float,
    first_s: float,
    keep_going: Callable[[], bool],
) -> None:
    def tick() -> None:
        counters.sync(queue)
        if keep_going():
            loop.after(period_s, tick)

    loop.at(first_s, tick)
