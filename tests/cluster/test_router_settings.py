"""How many routers run: a fixed count, or Serve autoscaling of the router deployment (no Ray here)."""

from __future__ import annotations

import pytest

from cluster.app import router_options
from cluster.config import AppConfig

REDIS = "redis://127.0.0.1:6379/0"


def test_a_fixed_count_by_default() -> None:
    options = router_options(AppConfig(num_routers=3, redis_url=REDIS))
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options


def test_autoscaled_routers_get_serves_autoscaling_on_their_ongoing_requests() -> None:
    scaling = {"min_routers": 2, "max_routers": 6, "target_ongoing_requests": 300, "upscale_delay_s": 3.0}
    config = AppConfig(router_autoscaling=scaling, redis_url=REDIS, num_routers=5)
    options = router_options(config)
    assert "num_replicas" not in options  # num_routers is ignored
    a = options["autoscaling_config"]
    assert (a.min_replicas, a.max_replicas, a.initial_replicas) == (2, 6, 2)
    assert (a.target_ongoing_requests, a.upscale_delay_s) == (300, 3.0)
    # Before the routers' poll sees the running count, the app's first count; while Redis is down
    # each router allows the share of the most routers that may run.
    assert config.initial_routers == 2
    assert config.fallback_fraction == pytest.approx(1 / 6)


def test_more_than_one_router_needs_shared_state() -> None:
    with pytest.raises(ValueError, match="needs redis_url"):
        AppConfig(router_autoscaling={"max_routers": 2})
    assert AppConfig(router_autoscaling={"max_routers": 1}).initial_routers == 1  # one router: no Redis


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"min_routers": 3, "max_routers": 2}, "max_routers must be >= min_routers"),
        ({"min_routers": 1, "max_routers": 3, "initial_routers": 4}, "initial_routers must lie between"),
        ({"target_ongoing_requests": 0}, "target_ongoing_requests"),
        ({"max_router": 2}, "max_router"),  # a misspelt field is refused, not ignored
    ],
)
def test_bounds_are_checked(scaling: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AppConfig(router_autoscaling=scaling, redis_url=REDIS)
