"""``autoscaling.policy: sla`` as Serve's custom autoscaling policy (a class Serve instantiates once).

Serve's controller calls it every control-loop tick with an ``AutoscalingContext``; the replicas'
custom metrics (``sla_metrics.py``, pushed by ``ReplicaServer.sla_stats``) carry the routers' class
loads, the engines' running requests and the replicas' measured start times. The policy decides at
most every ``metrics_interval_s`` (``sla_policy.decide``: no Ray in it) and returns the count; Serve's
wrapper applies the up- and downscale delays and its controller the bounds, and a scale-down drains
each stopping replica (``graceful_shutdown_timeout_s``). Nothing here moves replicas itself.

The decision, its reason, the predictions and the start times go on the board (``sla_board.py``)
for the routers' ``/admin/state``, Prometheus and the SLA report.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cluster.serving import sla_board
from cluster.serving.sla_capacity import ReplicaShape, shape_of
from cluster.serving.sla_metrics import START_S, unflatten
from cluster.serving.sla_policy import SlaPolicyConfig, decide
from cluster.serving.sla_signals import PoolState

log = logging.getLogger(__name__)


class SlaServePolicy:
    """``policy_kwargs``: ``step_model``, ``min_replicas``, ``max_replicas``, ``horizon_s``,
    ``utilization``, ``scale_for_over_share``, ``max_gpu_dollars_per_hour``, ``gpu_dollars_per_hour``
    (None: the routers' tenancy price), ``start_time_s`` (until a replica reports its own),
    ``down_headroom``, ``interval_s``."""

    def __init__(self, **kwargs: Any) -> None:
        self._kw = kwargs
        self._shape: ReplicaShape | None = None
        self._at = -1e18
        self._desired: int | None = None
        # The last decision that changed the count, whole (its predictions and inputs too): a
        # scale-up's own reasons outlive the holds that follow it (a decision every interval), so
        # /admin/state can say why the count last moved, and a bench whose sample of the up itself
        # was shed under a burst still sees what drove it.
        self._last_change: dict[str, Any] | None = None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        if ctx.current_num_replicas == 0:  # Serve's cold start path decides
            return ctx.target_num_replicas, {}
        now = time.time()
        if self._desired is not None and now - self._at < self._kw.get("interval_s", 1.0):
            return self._desired, {}
        self._at = now
        classes, figures = unflatten(ctx.aggregated_metrics or {})
        if not classes:  # no router has published yet: keep the count
            self._desired = ctx.target_num_replicas
            return self._desired, {}
        decision = decide(
            classes, self._pool(ctx, figures, now), self._shape_for(figures), self._config(figures)
        )
        self._desired = decision.desired
        starts = {
            getattr(r, "unique_id", str(r)): v
            for r, v in (ctx.aggregated_metrics or {}).get(START_S, {}).items()
        }
        made = decision.as_dict() | {"decided_at": now, "inputs": decision_inputs(classes)}
        if decision.desired != decision.current:
            self._last_change = made
        self._publish(ctx, made | {"replica_start_s": starts, "last_change": self._last_change})
        return decision.desired, {}

    def _pool(self, ctx: Any, figures: dict[str, float], now: float) -> PoolState:
        start = figures["start_s"] or self._kw.get("start_time_s", 60.0)
        starting = max(0, ctx.target_num_replicas - ctx.current_num_replicas)
        since = now - ctx.last_scale_up_time if ctx.last_scale_up_time else 0.0
        left = max(0.0, start - since) if starting else 0.0
        return PoolState(ctx.current_num_replicas, starting, left, figures["running"], start, figures["pace"])

    def _shape_for(self, figures: dict[str, float]) -> ReplicaShape:
        batch = max(1, round(figures["batch"]))
        if self._shape is None or self._shape.batch != batch:
            self._shape = shape_of(self._kw["step_model"], batch, self._kw.get("utilization", 0.9))
        return self._shape

    def _config(self, figures: dict[str, float]) -> SlaPolicyConfig:
        k = self._kw
        price = k.get("gpu_dollars_per_hour")
        return SlaPolicyConfig(
            k["min_replicas"],
            k["max_replicas"],
            k.get("horizon_s", 30.0),
            k.get("scale_for_over_share", False),
            k.get("max_gpu_dollars_per_hour"),
            figures["price"] if price is None else price,
            k.get("down_headroom", 0.2),
        )

    def _publish(self, ctx: Any, decision: dict) -> None:
        try:
            sla_board.publish_decision(ctx.app_name or "", ctx.deployment_name, decision)
        except Exception as exc:  # the GCS busy: the next decision publishes again
            log.debug("SLA decision not published: %s", exc)


def decision_inputs(classes: list) -> dict[str, dict[str, float | None]]:
    """What each class looked like to the decision (published with it, so a run's records say which
    input moved a count): its within-share rate and waiting requests, the over-share rate, and the
    measured TTFT and TPOT that calibrate the prediction."""
    return {
        c.name: {
            "within_rps": round(c.within.rate_rps, 3),
            "within_waiting": round(c.within.waiting_requests, 1),
            "over_rps": round(c.over.rate_rps, 3),
            "measured_ttft_s": c.measured_ttft_s,
            "measured_tpot_s": c.measured_tpot_s,
        }
        for c in classes
    }


def policy_kwargs(settings: Any, a: Any, device: str) -> dict[str, Any]:
    """The policy's kwargs (JSON) from a model's autoscaling settings (``AutoscalingSettings``)."""
    s = settings
    return {
        "step_model": s.step_model_for(device),
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "horizon_s": s.horizon_s,
        "utilization": s.utilization,
        "scale_for_over_share": s.scale_for_over_share,
        "max_gpu_dollars_per_hour": s.max_gpu_dollars_per_hour,
        "gpu_dollars_per_hour": s.gpu_dollars_per_hour,
        "start_time_s": s.start_time_s,
        "down_headroom": s.down_headroom,
        "interval_s": a.metrics_interval_s,
    }
