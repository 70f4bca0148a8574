"""The stop bound of replicas and routers (issue 19, defect 2) and the autoscaler's start count, as
``build_app`` hands them to Serve. The stop itself runs in tests/faults/test_downscale_streams.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.app import SHUTDOWN_WAIT_LOOP_S, replica_options, router_options
from cluster.config import ENGINE_CONTEXT_CAP, AppConfig
from replica.engine import MAX_CONTEXT_CAP


def test_the_default_bound_covers_a_maximum_length_answer() -> None:
    config = AppConfig()
    # The first-token wait, then the whole context at 10 tokens/s.
    assert config.graceful_shutdown_s == pytest.approx(120.0 + 8192 / 10.0)
    short = AppConfig(engine={"max_model_len": 2048}, first_token_timeout_s=30.0)
    assert short.graceful_shutdown_s == pytest.approx(30.0 + 2048 / 10.0)
    assert AppConfig(replica_graceful_shutdown_s=42.0).graceful_shutdown_s == 42.0
    assert ENGINE_CONTEXT_CAP == MAX_CONTEXT_CAP  # the engine's cap when max_model_len is None


def test_replicas_and_routers_get_the_bound() -> None:
    config = AppConfig(engine={"device": "cpu"}, replica_graceful_shutdown_s=300.0)
    for opts in (replica_options(config), router_options(config)):
        assert opts["graceful_shutdown_timeout_s"] == 300.0
        assert opts["graceful_shutdown_wait_loop_s"] == SHUTDOWN_WAIT_LOOP_S
    with pytest.raises(ValidationError, match="replica_graceful_shutdown_s"):
        AppConfig(replica_graceful_shutdown_s=0)


def test_autoscaling_starts_at_initial_replicas() -> None:
    auto = {"min_replicas": 1, "max_replicas": 3}
    config = AppConfig(engine={"device": "cpu"}, autoscaling=auto | {"initial_replicas": 2})
    assert replica_options(config)["autoscaling_config"].initial_replicas == 2
    assert (
        replica_options(AppConfig(engine={"device": "cpu"}, autoscaling=auto))[
            "autoscaling_config"
        ].initial_replicas
        == 1
    )
    with pytest.raises(ValidationError, match="initial_replicas"):
        AppConfig(autoscaling=auto | {"initial_replicas": 4})
