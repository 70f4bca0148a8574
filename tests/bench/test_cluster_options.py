"""The GPU cluster benchmark's options: routers per replica, a run-local Redis, the sweep's shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import yaml

from bench.cluster_args import parser, pick_plan
from bench.cluster_plan import at_load, with_answer_scale
from bench.cluster_run import Bench
from bench.cluster_steps import redis_server, with_replicas
from loadtest.capacity import offered_output_tps
from loadtest.scenario import load_scenario
from tests.redis_server import redis_server_binary


def _args(*extra: str):
    return parser().parse_args(["--out", "/nonexistent", *extra])


def test_with_replicas_sets_routers_and_redis(tmp_path: Path) -> None:
    base = tmp_path / "app.yaml"
    base.write_text(yaml.safe_dump({"num_replicas": 1, "num_routers": 1, "engine": {"model": "x"}}))
    two = yaml.safe_load(with_replicas(base, 2, routers=4, redis_url="redis://127.0.0.1:1/0").read_text())
    assert (
        two["num_replicas"] == 2 and two["num_routers"] == 4 and two["redis_url"] == "redis://127.0.0.1:1/0"
    )
    kept = yaml.safe_load(with_replicas(base, 2).read_text())
    assert kept["num_routers"] == 1 and "redis_url" not in kept


def test_plan_takes_the_sweep_shape_and_router_options() -> None:
    plan = pick_plan(
        _args(
            "--replicas", "1,2", "--sweep-scenario", "steady-long", "--scenarios", "", "--start-tps", "4500",
            "--rung-s", "12", "--rung-drain-s", "10", "--routers-per-replica", "2",
        )
    )  # fmt: skip
    assert plan.replicas == (1, 2) and plan.routers_per_replica == 2 and plan.scenarios == ()
    assert plan.sweep.scenario == "steady-long" and plan.start_tps == 4500
    assert plan.sweep.step_duration_s == 12 and plan.sweep.step_drain_s == 10
    bench = Bench(plan, Path("/nonexistent"), Path("/nonexistent"))
    bench.results["capacity_by_replicas"] = {}
    tps, basis = bench.first_rung_tps(1, estimate=9000.0)
    assert tps == 4500 and "--start-tps" in basis
    default = pick_plan(_args("--replicas", "1,2"))
    assert default.scenarios == ("noisy-neighbour", "mixed-sla") and default.sweep.scenario == "steady"
    assert default.answer_scale == 1.0 and default.sweep.factor == 1.5 and default.sweep.throughput == "span"


def test_plan_takes_a_finer_ladder_a_window_throughput_and_longer_answers() -> None:
    plan = pick_plan(
        _args(
            "--replicas", "1,2", "--factor", "1.25", "--rung-warmup-fraction", "0.25",
            "--rung-throughput", "window", "--answer-scale", "16", "--rescale-start", "0.8",
        )
    )  # fmt: skip
    assert plan.rescale_start == 0.8 and pick_plan(_args()).rescale_start == 0.5
    assert plan.sweep.factor == 1.25 and plan.sweep.warmup_fraction == 0.25
    assert plan.sweep.throughput == "window" and plan.answer_scale == 16


def test_answer_scale_lengthens_every_answer_and_keeps_the_offer_in_tokens() -> None:
    base = load_scenario("mixed-sla")  # alice uniform 8-24 tokens, carol fixed 48
    long = with_answer_scale(base, 16)
    alice, carol = long.tenants
    assert (alice.output.min, alice.output.max, carol.output.tokens) == (128, 384, 768)
    assert [t.prompt for t in long.tenants] == [t.prompt for t in base.tenants]  # prompts untouched
    assert with_answer_scale(base, 1.0) is base
    # at_load scales the longer scenario: the same tokens/s offered need 16x fewer requests
    plan = pick_plan(_args("--answer-scale", "16"))
    scale = 1.5 * 20_000 / offered_output_tps(long)
    assert offered_output_tps(at_load("mixed-sla", scale, plan, "m")) == pytest.approx(30_000)


def test_run_local_redis_answers_and_stops(tmp_path: Path) -> None:
    with redis_server(Path(redis_server_binary()), tmp_path) as url:
        assert url is not None
        client = redis.Redis.from_url(url)
        assert client.ping()
    with redis_server(None, tmp_path) as none:
        assert none is None
