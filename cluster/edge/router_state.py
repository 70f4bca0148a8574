"""What ``/admin/state`` and ``/health`` report about one router: totals over every model, then each
model's pool (its queue, room, replicas and leases) under ``models``.

The totals keep the one-model app's field names, so the drills and the soak that read them (the
router holds nothing, every lease is back) check every model at once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from cluster.routing.model_pool import ModelPool
from cluster.routing.replica_monitor import MonitorLoop, ReplicaMonitor


def pool_state(pool: ModelPool, monitor: ReplicaMonitor) -> dict[str, Any]:
    """One model's figures on this router."""
    d = pool.dispatcher
    return {
        "deployment": pool.deployment,
        "in_flight": d.in_flight,
        "displacing": d.displacing,  # in flight past the room, for a higher tier
        "capacity": d.capacity,
        "queued": len(d.queue),
        "replicas": monitor.replicas,
        "active_leases": pool.active_leases(),
        "waiters": d.waiters,
        "quota_store_degraded": pool.quotas.degraded,
    }


def models_state(pools: dict[str, ModelPool], monitors: MonitorLoop) -> dict[str, dict[str, Any]]:
    by_model = {m.model: m for m in monitors.monitors}
    return {name: pool_state(pool, by_model[name]) for name, pool in pools.items()}


def totals(models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sums over every model, under the one-model app's names; leases summed per tenant."""
    out: dict[str, Any] = {
        key: sum(m[key] for m in models.values())
        for key in ("in_flight", "displacing", "capacity", "queued", "replicas", "waiters")
    }
    leases: Counter[str] = Counter()
    for m in models.values():
        leases.update(m["active_leases"])
    out["active_leases"] = dict(leases)
    return out


def health(models: dict[str, int], draining: bool, degraded: bool) -> tuple[str, int]:
    """The router's status and HTTP code from each model's running replicas: it serves while any
    model has a replica (a model without one answers its own requests with 503s)."""
    if draining:
        status = "draining"
    elif sum(models.values()) <= 0:
        status = "no_replicas"
    else:
        status = "degraded" if degraded else "ok"  # degraded: serving on local quota limits
    return status, 200 if status in ("ok", "degraded") else 503
