"""``autoscaling.sla``: the SLA policy's settings (``autoscaling.policy: sla``), checked at the edge.

Bounds (``min_replicas`` / ``max_replicas``) and the up- and downscale delays are the autoscaling
settings' own; Serve applies them to every policy's decision alike.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# A replica's capacity when the settings name no step model: the simulator's fits.
CPU_STEP_MODEL = "cpu-smollm2-cluster"
GPU_STEP_MODEL = "h200-llama-3.1-8b"


class SlaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step_model: str | None = Field(
        default=None,
        description="A replica's step-time model (loadtest/sim/data/step_<name>.json, or a JSON path): "
        f"its capacity. None: {CPU_STEP_MODEL} on a CPU engine, else {GPU_STEP_MODEL}.",
    )
    goal: float = Field(
        default=0.99,
        gt=0,
        le=1,
        description="Attainment each SLA class must keep (share meeting TTFT and TPOT).",
    )
    class_goals: dict[str, float] = Field(
        default_factory=dict, description="Per SLA class, a goal other than `goal`."
    )
    horizon_s: float = Field(
        default=30.0, gt=0, le=3600, description="Seconds looked ahead beyond one replica start."
    )
    utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of the step model's full-batch throughput counted on (arrivals come in bursts).",
    )
    scale_for_over_share: bool = Field(
        default=False,
        description="Count work beyond tenants' fair share (at the bound) too; false: it never buys "
        "a replica.",
    )
    share_basis: Literal["active", "configured"] = Field(
        default="active",
        description="A tenant's fair share of the bound: active (max-min by weight among the tenants "
        "with recent demand: a lone tenant may use it all) or configured (weight / the weights of every "
        "tenant configured on the model, idle or not).",
    )
    max_gpu_dollars_per_hour: float | None = Field(
        default=None, gt=0, description="Cost ceiling: replicas × price per replica-hour stays below it."
    )
    gpu_dollars_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="A replica's price per hour; None: the tenancy's gpu_dollars_per_hour (the SLA "
        "report's).",
    )
    start_time_s: float = Field(
        default=60.0,
        gt=0,
        description="A replica's start (process start to serving) until the replicas publish their own.",
    )
    window_s: float = Field(default=60.0, gt=0, le=600, description="Window of the routers' arrival rates.")
    down_headroom: float = Field(
        default=0.2, ge=0, le=2, description="Rates are raised by this share when checking a scale-down."
    )

    def goal_of(self, sla_class: str) -> float:
        return self.class_goals.get(sla_class, self.goal)

    def step_model_for(self, device: str) -> str:
        if self.step_model is not None:
            return self.step_model
        return CPU_STEP_MODEL if device == "cpu" else GPU_STEP_MODEL
