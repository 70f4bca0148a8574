"""Replica autoscaling on the engines' own counts (cluster/serving/engine_load_policy.py): the
policy's arithmetic through Serve's own wrapper (factors, delays), and the app wiring it in only
with direct dispatch."""

from __future__ import annotations

from ray.serve._private.autoscaling_state import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from cluster.app import replica_options
from cluster.config import AppConfig
from cluster.serving.engine_load_policy import ENGINE_REQUESTS, engine_requests_policy

SCALING = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2.0,
           "upscale_delay_s": 0.0, "downscale_delay_s": 0.0}  # fmt: skip


def _ctx(replicas: int, engine_counts: list[float] | None, handle_count: float = 0.0) -> AutoscalingContext:
    metrics = None if engine_counts is None else {ENGINE_REQUESTS: dict(enumerate(engine_counts))}
    return AutoscalingContext(
        deployment_id=None, deployment_name="Replica", app_name="fairlane",
        current_num_replicas=replicas, target_num_replicas=replicas, running_replicas=[],
        total_num_requests=handle_count, total_queued_requests=0.0,
        aggregated_metrics=metrics, raw_metrics=None,
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=4,
        policy_state={}, last_scale_up_time=None, last_scale_down_time=None,
        current_time=100.0, config=AutoscalingConfig(**SCALING),
    )  # fmt: skip


def test_the_engines_counts_set_the_replicas_wanted_though_serves_handles_saw_nothing() -> None:
    assert engine_requests_policy(_ctx(1, [7.0]))[0] == 3.5  # 7 requests at 2 a replica
    assert engine_requests_policy(_ctx(2, [1.0, 0.0]))[0] == 0.5
    decide = _apply_autoscaling_config(engine_requests_policy)  # Serve's own wrapper
    assert decide(_ctx(1, [7.0], handle_count=0.0))[0] == 4  # up, rounded, at once (no delay)
    assert decide(_ctx(1, [30.0]))[0] == 15  # (Serve's controller bounds it by max_replicas after)
    assert decide(_ctx(3, [0.0, 0.0, 0.0]))[0] == 1  # idle: down to the minimum


def test_before_any_report_the_count_stays() -> None:
    assert engine_requests_policy(_ctx(2, None))[0] == 2
    assert engine_requests_policy(_ctx(2, []))[0] == 2


def test_the_app_uses_the_policy_with_direct_dispatch_only() -> None:
    direct = AppConfig.model_validate({"autoscaling": SCALING})  # direct dispatch is the default
    assert direct.direct_dispatch
    served = AppConfig.model_validate(direct.model_dump() | {"direct_dispatch": False})
    custom = replica_options(direct)["autoscaling_config"].policy.policy_function
    default = replica_options(served)["autoscaling_config"].policy.policy_function
    assert custom == "cluster.serving.engine_load_policy.engine_requests_policy"  # Serve keeps its path
    assert default == "ray.serve.autoscaling_policy:default_autoscaling_policy"
