"""The simulator's inputs (pydantic, validated once at the edge): scale-up, cluster, policies.

The workload itself comes from a load-generator scenario (``loadtest.scenario.Scenario``); these
models say how to scale it to platform size and what to simulate it on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.config import AppConfig
from tenancy import DispatchPolicy

ChoiceName = Literal["round_robin", "least_loaded", "fairlane"]
RouterChoiceName = Literal["power_of_two", "random", "tenant_two"]
# The cluster's counter sync runs every counter_sync_s on a task of its own (RouterCore.start_counter_sync);
# until 2026-12-02 it was the monitor loop's load_poll_interval_s (1.0 s), which this default followed.
COUNTER_SYNC_S: float = AppConfig.model_fields["counter_sync_s"].default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicySpec(_Strict):
    """One row of the comparison: admission × dispatch policy × replica choice."""

    name: str = Field(min_length=1, description="Label in reports.")
    quotas: bool = Field(description="Admission through tenancy.QuotaManager (RPM/TPM/concurrency).")
    dispatch: DispatchPolicy = Field(description="The router's dispatch policy (fcfs, vtc or fairlane).")
    choice: ChoiceName = Field(default="fairlane", description="Replica choice policy.")


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec(name="fcfs", quotas=False, dispatch="fcfs"),
        PolicySpec(name="rate_limits", quotas=True, dispatch="fcfs"),
        PolicySpec(name="vtc", quotas=False, dispatch="vtc"),
        PolicySpec(name="fairlane", quotas=False, dispatch="fairlane"),
        PolicySpec(name="fairlane+quotas", quotas=True, dispatch="fairlane"),
        PolicySpec(name="fairlane+round_robin", quotas=False, dispatch="fairlane", choice="round_robin"),
        PolicySpec(name="fairlane+least_loaded", quotas=False, dispatch="fairlane", choice="least_loaded"),
    )
}


class ScaleSpec(_Strict):
    """How the scenario's tenants are cloned and its rates rescaled to platform size."""

    tenants: int = Field(default=1000, gt=0, description="Tenants, cloned round-robin from the scenario's.")
    requests: int = Field(default=100_000, gt=0, description="Requests to generate (about; Poisson).")
    load_factor: float = Field(default=1.5, gt=0, description="Offered work / estimated cluster capacity.")
    rate_skew: float = Field(default=1.1, ge=0, description="Zipf exponent of per-tenant rates (0 = equal).")
    heavy_fraction: float = Field(default=0.01, ge=0, le=1, description="Share of tenants that are heavy.")
    heavy_weight: float = Field(
        default=4.0, gt=0, description="Fair-share weight of heavy tenants (others 1)."
    )
    diurnal_amplitude: float = Field(default=0.4, ge=0, lt=1, description="Rate × (1 + A·sin) over the run.")
    diurnal_cycles: float = Field(default=1.0, ge=0, description="Diurnal periods over the run.")
    quota_headroom: float = Field(
        default=1.0, gt=0, description="RPM quota = headroom × weighted share of capacity."
    )
    bundled_prompt_tokens: float = Field(default=60.0, gt=0, description="Mean prompt of 'bundled' prompts.")
    seed: int | None = Field(default=None, description="None: the scenario's seed.")


class AutoscalingSpec(_Strict):
    """Serve ``autoscaling_config`` semantics plus the replica start time."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=64, gt=0)
    initial_replicas: int | None = Field(default=None, ge=0)
    target_ongoing_requests: float = Field(default=24.0, gt=0)
    upscale_delay_s: float = Field(default=30.0, ge=0)
    downscale_delay_s: float = Field(default=600.0, ge=0)
    metrics_interval_s: float = Field(default=10.0, gt=0)
    look_back_period_s: float = Field(default=30.0, gt=0)
    replica_start_s: float = Field(default=60.0, ge=0, description="Creation to ready (pull, load, warm).")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        return self


class ClusterSpec(_Strict):
    """Replicas and their engine, the router's room and timeouts, the price."""

    replicas: int = Field(default=64, gt=0, description="Fixed replicas (initial, with autoscaling).")
    step_model: str = Field(
        default="h200-llama-3.1-8b", description="loadtest/sim/data/step_<name>.json or path."
    )
    kv_blocks: int = Field(default=54_067, gt=0, description="KV blocks per replica (8B on H200: 54 067).")
    block_size: int = Field(default=16, gt=0)
    max_num_seqs: int = Field(default=64, gt=0)
    max_num_batched_tokens: int = Field(default=2048, gt=0)
    replica_room: int = Field(default=32, gt=0, description="Router's in-flight requests per replica.")
    queue_timeout_s: float = Field(default=60.0, gt=0)
    routing_stats_period_s: float = Field(default=0.5, gt=0)
    gpu_dollars_per_hour: float = Field(default=5.0, ge=0)
    autoscaling: AutoscalingSpec | None = None
    join_lag_steps: int = Field(
        default=0, ge=0, description="Steps a request arriving mid-step waits beyond the next (async: 1)."
    )
    dispatch_latency_s: float = Field(
        default=0.0, ge=0, description="Router grant → the replica's engine sees the request (Serve hop)."
    )
    client_latency_s: float = Field(
        default=0.0, ge=0, description="Added to client-seen first token and end (proxy, HTTP, SSE, ingress)."
    )
    routers: int = Field(
        default=1, gt=0, le=64, description="Router replicas: each its own fair queue and share of the room."
    )
    counter_sync_s: float = Field(
        default=COUNTER_SYNC_S, gt=0, description="Fair-share counter exchange period between routers."
    )
    share_lifts: bool = Field(
        default=False,
        description="Routers share lifts as offsets kept by maximum (tenancy/shared_lifts.py).",
    )
    router_choice: RouterChoiceName = Field(
        default="power_of_two",
        description="How Serve's proxy picks a router: power_of_two (fewer held), random, or "
        "tenant_two (fewer of the tenant's waiting; not Serve's, opt-in).",
    )


class SimSpec(_Strict):
    """Everything one ``fairlane simulate`` run needs besides the scenario."""

    scale: ScaleSpec = Field(default_factory=ScaleSpec)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    policies: tuple[str, ...] = Field(default=("fcfs", "rate_limits", "vtc", "fairlane"), min_length=1)
    sample_interval_s: float = Field(default=5.0, gt=0, description="Fairness sampling period.")
    write_records: bool = Field(default=True, description="Per-request JSONL (large at 1M requests).")

    @model_validator(mode="after")
    def _known_policies(self) -> SimSpec:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
        return self
