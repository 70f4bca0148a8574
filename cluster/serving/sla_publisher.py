"""The router's side of ``autoscaling.policy: sla``, run as a monitor-loop hook (every
``load_poll_interval_s``): for each model on the SLA policy, publish this router's class loads
(``sla_router_signals.py``) on the board, read back the policy's last decision, and show it in
``/admin/state`` (``LAST_DECISIONS``, read by ``cluster/edge/router_state.py``) and Prometheus.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from cluster.serving import replica_board, sla_board
from cluster.serving.sla_capacity import ReplicaShape, shape_of
from cluster.serving.sla_policy import SlaPolicyConfig
from cluster.serving.sla_router_signals import ArrivalLog, as_payload, router_loads

log = logging.getLogger(__name__)

# deployment → the policy's last decision as this router read it (with replica-hours and dollars)
LAST_DECISIONS: dict[str, dict[str, Any]] = {}


class SlaGauges:
    """Prometheus series of the SLA policy, per model, on the router's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.attainment = Gauge(
            "fairlane_sla_predicted_attainment",
            "The SLA autoscaling policy's predicted attainment per class at the current replica count.",
            ("model", "sla_class"),
            registry=r,
        )
        self.desired = Gauge(
            "fairlane_autoscaling_desired_replicas", "The SLA policy's replica count.", ("model",), registry=r
        )
        self.action = Gauge(
            "fairlane_autoscaling_decision",
            "1 for the SLA policy's last action (up, down, hold).",
            ("model", "action"),
            registry=r,
        )
        self.start = Gauge(
            "fairlane_replica_start_seconds",
            "A replica's measured start: process start to serving.",
            ("model", "replica"),
            registry=r,
        )
        self.hours = Gauge(
            "fairlane_replica_hours",
            "Replica-hours this router has seen the model use.",
            ("model",),
            registry=r,
        )
        self.dollars = Gauge(
            "fairlane_replica_dollars",
            "Those replica-hours at the tenancy's GPU price.",
            ("model",),
            registry=r,
        )

    def show(self, model: str, decision: dict[str, Any], hours: float, dollars: float) -> None:
        now = decision["predictions"][0]["attainment"] if decision.get("predictions") else {}
        for cls, value in now.items():
            self.attainment.labels(model, cls).set(value)
        self.desired.labels(model).set(decision["desired"])
        action = decision["reason"].split(":")[0]
        for a in ("up", "down", "hold"):
            self.action.labels(model, a).set(1 if a == action else 0)
        for replica, start in decision.get("replica_start_s", {}).items():
            self.start.labels(model, replica).set(start)
        self.hours.labels(model).set(hours)
        self.dollars.labels(model).set(dollars)


class SlaPublisher:
    def __init__(self, core: Any, config: Any, app: str, router_id: str, generation: str) -> None:
        self._core, self._app, self._router, self._generation = core, app, router_id, generation
        self._models = {
            m.name: m for m in config.served_models if m.autoscaling and m.autoscaling.policy == "sla"
        }
        self._logs = {name: ArrivalLog(m.autoscaling.sla.window_s) for name, m in self._models.items()}
        self._shapes: dict[str, ReplicaShape] = {}
        self._gauges = SlaGauges(core.metrics.registry) if self._models else None

    @property
    def active(self) -> bool:
        return bool(self._models)

    async def poll(self) -> None:
        for name, model in self._models.items():
            try:
                await self._one(name, model)
            except Exception as exc:  # the GCS busy, a reload in progress: the next poll tries again
                log.debug("SLA signals of %s not published: %s", name, exc)

    async def _one(self, name: str, model: Any) -> None:
        pool, a = self._core.pools[name], model.autoscaling
        shape = await self._shape(name, model, max(1, pool.dispatcher.room))
        policy = SlaPolicyConfig(
            a.min_replicas,
            a.max_replicas,
            a.sla.horizon_s,
            a.sla.scale_for_over_share,
            a.sla.max_gpu_dollars_per_hour,
            self._price(pool, a),
        )
        goals = {c.name: a.sla.goal_of(c.name) for c in pool.tenancy.sla_classes}
        waiting = pool.dispatcher.queue.waiting()
        loads = router_loads(
            self._logs[name],
            name,
            waiting,
            self._core.recorder.records(),
            pool.tenancy,
            shape,
            policy,
            goals,
            time.monotonic(),
            a.sla.share_basis,
        )
        payload = as_payload(loads, shape.batch, self._price(pool, a))
        await asyncio.to_thread(sla_board.publish_signals, self._app, pool.deployment, self._router, payload)
        decision = await asyncio.to_thread(sla_board.read_decision, self._app, pool.deployment)
        if decision is not None:
            hours = self._core.recorder.model_replica_seconds.get(name, 0.0) / 3600.0
            dollars = hours * self._price(pool, a)
            LAST_DECISIONS[pool.deployment] = decision | {"replica_hours": hours, "dollars": dollars}
            self._gauges.show(name, decision, hours, dollars)

    def _price(self, pool: Any, a: Any) -> float:
        given = a.sla.gpu_dollars_per_hour
        return pool.tenancy.gpu_dollars_per_hour if given is None else given

    async def _shape(self, name: str, model: Any, batch: int) -> ReplicaShape:
        """The model's step model at this batch; an ``auto`` device is read off a replica's load."""
        shape = self._shapes.get(name)
        if shape is None or shape.batch != batch:
            device = model.engine.device
            if device == "auto":
                loads = await asyncio.to_thread(replica_board.fresh_loads, self._generation)
                devices = [
                    str(v.get("engine", {}).get("device", ""))
                    for v in loads.values()
                    if v.get("model") == name
                ]
                device = "cpu" if not devices or devices[0].startswith("cpu") else "cuda"
            s = model.autoscaling.sla
            shape = shape_of(s.step_model_for(device), batch, s.utilization)
            self._shapes[name] = shape
        return shape
