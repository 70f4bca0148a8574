"""How many routers run: a fixed count, or Serve autoscaling of the router deployment on its own load.

A router's load is its ongoing HTTP requests (streams open, answers being computed, requests waiting
in its fair queue): Serve counts them on the proxy's handle, or on the router itself under direct
ingress. Routers share quota, concurrency and fair-share state through Redis, so a config that may
run more than one router needs ``redis_url`` (``AppConfig`` refuses it otherwise).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.model_settings import check_scaling_bounds


class RouterAutoscalingSettings(BaseModel):
    """Serve autoscaling of the router deployment (``router_autoscaling``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_routers: int = Field(default=1, ge=1, description="Routers kept when idle.")
    max_routers: int = Field(default=4, ge=1, description="Routers at most.")
    initial_routers: int | None = Field(
        default=None, ge=1, description="Routers started with the app; None = min_routers."
    )
    target_ongoing_requests: float = Field(
        default=512.0,
        gt=0,
        description="Ongoing requests per router aimed at: open streams and waiting requests alike.",
    )
    upscale_delay_s: float = Field(
        default=5.0, ge=0, description="Load must last this long before adding one."
    )
    downscale_delay_s: float = Field(
        default=60.0,
        ge=0,
        description="Low load must last this long before a router stops (it drains first).",
    )
    metrics_interval_s: float = Field(default=1.0, gt=0, description="How often the load is reported.")

    @model_validator(mode="after")
    def _bounds(self) -> RouterAutoscalingSettings:
        check_scaling_bounds(self.min_routers, self.max_routers, self.initial_routers, "routers")
        return self

    @property
    def first(self) -> int:
        """Routers the app starts with."""
        return self.initial_routers or self.min_routers
