"""Serve autoscaling of the replicas on what their engines hold, for direct dispatch.

Serve's default policy counts the requests its handles sent (running and queued there). A router
with direct dispatch sends its requests over its own connection to each replica
(``routing/direct_dispatch.py``), so Serve never sees them. Each replica therefore reports its
engine's running and waiting requests (``ReplicaServer.engine_requests`` as Serve's
``record_autoscaling_stats`` hook, set under direct dispatch only; pushed every
``metrics_interval_s`` and averaged over ``look_back_period_s``), and this policy asks for as many
replicas as that total needs at ``target_ongoing_requests`` each. Serve's wrapper around a custom
policy then applies the scaling factors and the up- and downscale delays, and its controller the
bounds, as for its own policy. Requests sent through Serve's handle reach the engine too, so they
are counted once.
"""

from __future__ import annotations

from typing import Any

from ray.serve.config import AutoscalingContext

ENGINE_REQUESTS = "engine_requests"


def engine_requests_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Replicas wanted: the engines' running + waiting requests over the target per replica."""
    if ctx.current_num_replicas == 0:  # Serve's cold start path decides
        return ctx.target_num_replicas, {}
    reported = (ctx.aggregated_metrics or {}).get(ENGINE_REQUESTS)
    if not reported:  # no replica has reported yet: keep what there is
        return ctx.current_num_replicas, {}
    return sum(reported.values()) / ctx.config.get_target_ongoing_requests(), {}
