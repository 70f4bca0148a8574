"""The SLA policy through Serve's custom autoscaling interface: the replicas' flat metrics in, Serve's
own wrapper (delays, factors) around it, and the app choosing it for ``autoscaling.policy: sla``."""

from __future__ import annotations

import pytest
from ray.serve._private.autoscaling_state import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from cluster.app import replica_options
from cluster.config import AppConfig
from cluster.serving import sla_board
from cluster.serving.sla_metrics import combine, flatten, unflatten
from cluster.serving.sla_router_signals import as_payload
from cluster.serving.sla_serve_policy import SlaServePolicy
from cluster.serving.sla_signals import ClassLoad, StepPace, Work

SCALING = {"min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 0.0, "downscale_delay_s": 0.0}
KWARGS = {
    "step_model": "cpu-smollm2-cluster",
    "min_replicas": 1,
    "max_replicas": 3,
    "start_time_s": 10.0,
    "interval_s": 0.0,
}


def _classes(inter: Work, batch_over: Work) -> list[ClassLoad]:
    return [
        ClassLoad("interactive", 0, 1.0, 0.3, 0.99, inter, Work()),
        ClassLoad("batch", 2, 60.0, 1.0, 0.99, Work(), batch_over),
    ]


def _ctx(replicas: int, classes: list[ClassLoad]) -> AutoscalingContext:
    flat = flatten(*combine([as_payload(classes, batch=2, price=5.0)]), running=2.0, start_s=8.0)
    metrics = {k: {f"r{i}": v for i in range(replicas)} for k, v in flat.items()}
    return AutoscalingContext(
        deployment_id=None,
        deployment_name="Replica",
        app_name="fl",
        current_num_replicas=replicas,
        target_num_replicas=replicas,
        running_replicas=[],
        total_num_requests=0.0,
        total_queued_requests=0.0,
        aggregated_metrics=metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=3,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=100.0,
        config=AutoscalingConfig(**SCALING),
    )


@pytest.fixture(autouse=True)
def _board(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    published: list[dict] = []
    monkeypatch.setattr(sla_board, "publish_decision", lambda app, dep, d: published.append(d))
    return published


def test_the_metrics_round_trip_through_serves_flat_floats() -> None:
    classes = _classes(Work(3, 90, 60, 2.0, 0.1, 30, 20, 1.5), Work(40, 4000, 4000, 1.0, 0.0, 100, 100, 1.0))
    pace = {"steps": 50, "decode_rows": 100, "prefill_tokens": 400, "context_tokens": 9000, "period_s": 0.5}
    merged = combine([as_payload(classes, 2, 5.0), as_payload(classes, 2, 5.0)])
    flat = flatten(*merged, running=4, start_s=8, pace=pace)
    back, pool = unflatten({k: {"a": v, "b": v} for k, v in flat.items()})
    inter = next(c for c in back if c.name == "interactive")
    assert inter.within.waiting_requests == 6 and inter.within.rate_rps == 4.0  # two routers summed
    assert inter.measured_ttft_s is None and inter.tier == 0
    two_replicas = StepPace(100, 200, 800, 18000, 1.0)  # each replica's steps, summed
    assert pool == {"running": 8.0, "start_s": 8.0, "batch": 2.0, "price": 5.0, "pace": two_replicas}


def test_an_interactive_burst_scales_up_and_an_over_share_batch_backlog_does_not(_board: list[dict]) -> None:
    decide = _apply_autoscaling_config(SlaServePolicy(**KWARGS))  # as Serve's controller wraps it
    # 0.9 of a replica's work arriving and 4 waiting: one replica would still be behind after a start
    burst = _classes(Work(4, 120, 80, 1.2, 0.0, 30, 20, 1.2), Work())
    assert decide(_ctx(1, burst))[0] >= 2
    assert _board[-1]["reason"].startswith("up") and _board[-1]["replica_start_s"] == {"r0": 8.0}
    said = _board[-1]["inputs"]["interactive"]  # what the decision saw, published beside it
    assert (said["within_rps"], said["within_waiting"], said["over_rps"]) == (1.2, 4.0, 0.0)
    up = _board[-1]["last_change"]
    assert up["reason"] == _board[-1]["reason"] and up["desired"] >= 2 and up["current"] == 1
    # whole: a reader that saw only the holds after it still sees what the up predicted and saw
    assert up["inputs"] == _board[-1]["inputs"] and up["predictions"] == _board[-1]["predictions"]
    flood = _classes(Work(), Work(200, 20_000, 12_800, 20.0, 0.0, 100, 64, 20.0))
    assert decide(_ctx(1, flood))[0] == 1
    assert _board[-1]["reason"].startswith("hold")
    assert _board[-1]["last_change"] == up  # a hold keeps the reason the count last moved for
    fresh = _apply_autoscaling_config(SlaServePolicy(**KWARGS))
    fresh(_ctx(1, flood))
    assert _board[-1]["last_change"] is None  # nothing has moved the count yet


def test_no_router_signals_keep_the_count() -> None:
    ctx = _ctx(2, [])
    ctx._aggregated_metrics_value = {}
    assert SlaServePolicy(**KWARGS)(ctx)[0] == 2


def test_the_app_uses_the_sla_policy_for_policy_sla() -> None:
    config = AppConfig.model_validate({"autoscaling": SCALING | {"policy": "sla", "sla": {"horizon_s": 20}}})
    policy = replica_options(config)["autoscaling_config"].policy
    assert policy.policy_function == "cluster.serving.sla_serve_policy.SlaServePolicy"
    assert policy.policy_kwargs["horizon_s"] == 20 and policy.policy_kwargs["max_replicas"] == 3
    plain = AppConfig.model_validate({"autoscaling": SCALING})
    assert replica_options(plain)["autoscaling_config"].policy.policy_function.endswith(
        "engine_requests_policy"
    )
    with pytest.raises(ValueError):
        AppConfig.model_validate({"autoscaling": SCALING | {"policy": "sla", "sla": {"goal": 1.5}}})


def test_the_chart_accepts_policy_sla_and_its_keys() -> None:
    import helm_python

    from tests.helm.chart import chart, chart_defaults

    values = chart_defaults()
    values["app"]["autoscaling"] |= {
        "policy": "sla",
        "sla": {"goal": 0.99, "max_gpu_dollars_per_hour": 200.0},
    }
    chart().validate_schema(values)
    values["app"]["autoscaling"]["sla"] = {"goal": 0.99, "horizon": 30}
    with pytest.raises(helm_python.HelmValuesError):
        chart().validate_schema(values)
