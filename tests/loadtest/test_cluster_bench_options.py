"""The GPU cluster benchmark's options: routers per replica, a run-local Redis, the sweep's shape."""

from __future__ import annotations

from pathlib import Path

import redis
import yaml

from loadtest.cluster_bench_steps import redis_server, with_replicas
from loadtest.device_cluster_run import Bench, parser, pick_plan
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


def test_run_local_redis_answers_and_stops(tmp_path: Path) -> None:
    with redis_server(Path(redis_server_binary()), tmp_path) as url:
        assert url is not None
        client = redis.Redis.from_url(url)
        assert client.ping()
    with redis_server(None, tmp_path) as none:
        assert none is None
