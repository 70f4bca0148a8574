"""bench/router_data_path: the stand-in replica paces tokens by its own TPOT and batches like the
replica server, and the whole benchmark at its smoke size (a real Ray app, its router and proxy, the
stand-in behind the stream channel) delivers every token in order, once, and reports its figures."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench.step_replica import FIRST_TOKEN_ID, StepReplica
from cluster.serving.wire import GenerateArgs
from tests.bench.smoke_run import run_smoke


def test_the_stand_in_paces_by_its_tpot_and_batches_by_coalesce() -> None:
    async def items(coalesce_s: float) -> tuple[list[dict], float]:
        replica = StepReplica(tpot_s=0.005)
        start = time.monotonic()
        args = GenerateArgs("r", [1, 2, 3], {"max_tokens": 20}, coalesce_s)
        got = [item async for item in replica.generate(args)]
        return got, time.monotonic() - start

    (single, took), (batched, _) = asyncio.run(items(0.0)), asyncio.run(items(0.02))
    assert took >= 20 * 0.005  # token k is due k + 1 steps after arrival
    for stream in (single, batched):
        assert [t for i in stream for t in i["token_ids"]] == list(range(FIRST_TOKEN_ID, FIRST_TOKEN_ID + 20))
        assert stream[-1]["done"] and stream[-1]["finish_reason"] == "length"
    assert len(batched) < len(single) and len(batched[0]["token_ids"]) == 1


@pytest.mark.slow
def test_the_smoke_run_delivers_every_token_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    result, printed = run_smoke("bench.router_data_path", out, timeout_s=600)
    streams, short = result["phases"]["streams"], result["phases"]["short"]
    assert streams["ok_requests"] > 0 and short["ok_requests"] > 0
    for phase in (streams, short):
        assert phase["failed"] == 0 and phase["disordered_streams"] == 0, phase["errors"]
        assert phase["router_plus_proxy_cpu_ms_per_request"] > 0
        assert phase["router_loop_lag_ms"]["probes"] > 0
    assert streams["stream_channel"]["frames"] > 0 and streams["tokens_per_s"] > 0
    assert "ok req/s" in printed  # the table, printed last


def test_several_routers_cpu_is_summed_and_the_worst_loop_lag_reported() -> None:
    from bench.data_path_client import Tally
    from bench.router_data_path import summarize

    cpu0 = {"router": 1.0, "router2": 2.0, "proxy": 0.0, "replica": 0.0, "replica2": 1.0}
    cpu1 = {"router": 2.0, "router2": 2.5, "proxy": 0.0, "replica": 0.25, "replica2": 1.5}
    states = [
        {
            "loop_lag": {"max_ms": 40.0, "p99_ms": 9.0, "probes": 10},
            "direct_dispatch": {"m": 3},
            "gc": {"max_ms": 7.0},
        },
        {
            "loop_lag": {"max_ms": 25.0, "p99_ms": 12.0, "probes": 11},
            "direct_dispatch": {"m": 4},
            "gc": {"max_ms": 2.0},
        },
    ]
    phase = summarize("short", [Tally(ok=300), Tally(ok=200)], cpu0, cpu1, 10.0, states)
    assert phase["routers"] == 2 and phase["ok_rps"] == 50.0
    per = phase["cpu_ms_per_request"]
    assert per["router"] == 2.0 and per["router2"] == 1.0 and per["routers_total"] == 3.0
    assert phase["router_plus_proxy_cpu_ms_per_request"] == 3.0
    assert per["replica"] == 0.5 and per["replica2"] == 1.0 and per["replicas_total"] == 1.5  # every replica
    assert [g["max_ms"] for g in phase["router_gc"]] == [7.0, 2.0]  # each router's collector pauses
    assert phase["router_loop_lag_ms"] == {"max_ms": 40.0, "p99_ms": 12.0, "probes": 21}
    assert phase["direct_dispatch_sent"] == [{"m": 3}, {"m": 4}]


def test_every_router_and_replica_process_is_named() -> None:
    from bench.router_cost import numbered

    named = numbered(
        "replica", [("SERVE_REPLICA::fairlane#Replica#b", 12), ("SERVE_REPLICA::fairlane#Replica#a", 11)]
    )
    assert named == {"replica": 11, "replica2": 12}
    assert numbered("router", []) == {}


def test_a_set_override_may_name_one_engine_field() -> None:
    from argparse import Namespace

    from bench.router_data_path import bench_config

    settings = ["engine.late_launch=true", "stream_flush_s=0.01"]
    config = bench_config(Namespace(streams=8, short_clients=8, replicas=1, routers=1, set=settings))
    assert (config.engine.late_launch, config.engine.device, config.stream_flush_s) == (True, "cpu", 0.01)
