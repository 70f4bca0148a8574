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
from cluster.serving.sla_publisher import LAST_DECISIONS


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
        "room_per_replica": d.room,
        "stream_flush_s": pool.runner.flush_now_s,  # the replicas' hold of streamed outputs, last asked
        **monitor.room.state(),
        "engine": engine_sizes(monitor),
        "active_leases": pool.active_leases(),
        "waiters": d.waiters,
        "quota_store_degraded": pool.quotas.degraded,
        # autoscaling.policy: sla: the policy's last decision, reason, predictions, start times, cost
        "autoscaling": LAST_DECISIONS.get(pool.deployment),
    }


def engine_sizes(monitor: ReplicaMonitor) -> dict[str, Any] | None:
    """What one of the model's replicas runs on and with (its last load), or None before one reported."""
    for load in monitor.loads.values():
        if load.get("engine"):
            return load["engine"]
    return None


def engine_figures(monitor: ReplicaMonitor) -> dict[str, Any] | None:
    """``/health``'s figures of a model: device, dtype, slots, KV tokens and the router's room."""
    engine = engine_sizes(monitor)
    if engine is None:
        return None
    keys = ("device", "dtype", "max_num_seqs", "max_num_batched_tokens", "kv_tokens", "max_model_len")
    return {**{k: engine.get(k) for k in keys}, "room": monitor.room_per_replica}


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
