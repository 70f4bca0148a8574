"""The router's per-request cost switches, without Ray: the SSE tail leaves as one piece, Serve's
access log follows ``serve_access_log``, and the replica streams use the gRPC channel by default."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from bench.router_cost import PacedReplica
from cluster.app import USER_CODE_THREAD_VAR, replica_options, router_options
from cluster.config import AppConfig
from cluster.edge.responses import ResponseMeta, sse_stream
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.request_flow import RequestRunner
from cluster.routing.request_job import Timeouts
from cluster.serving.wire import GenerateArgs
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import FairQueue, MemoryQuotaStore, QuotaManager, default_tenancy_config


def _item(text: str, n: int, finish: str | None = None) -> dict:
    return {
        "text": text, "finish_reason": finish, "num_prompt_tokens": 3, "num_output_tokens": n, "index": 0,
        "token_ids": [1] * len(text), "total_output_tokens": n, "done": finish is not None,
    }  # fmt: skip


async def _pieces(items: list[dict], include_usage: bool, pulled: list[int]) -> list[bytes]:
    async def outputs() -> AsyncIterator[dict]:
        for i, item in enumerate(items):
            yield item
            pulled.append(i)  # resumed after item i: the request's own ending code runs here

    meta = ResponseMeta("completion", "cmpl-x", "m", 0)
    return [piece async for piece in sse_stream(meta, outputs(), include_usage)]


def test_the_last_chunk_usage_and_done_leave_as_one_piece() -> None:
    items = [_item(" a", 1), _item(" b", 2), _item(" c", 3, "length")]
    pulled: list[int] = []
    pieces = asyncio.run(_pieces(items, True, pulled))
    assert len(pieces) == 3
    events = b"".join(pieces).decode().split("\n\n")
    assert events[2].startswith('data: {"id":"cmpl-x"') and '"finish_reason":"length"' in events[2]
    usage = '"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6,'
    assert usage + '"prompt_tokens_details":{"cached_tokens":0}}' in events[3]
    assert events[4:] == ["data: [DONE]", ""]
    assert pulled == [0, 1, 2]  # the outputs were pulled to their end (the request closes as "ok")


def test_a_stream_without_a_finished_output_still_ends_with_done() -> None:
    pieces = asyncio.run(_pieces([_item(" a", 1)], False, []))
    assert pieces[-1] == b"data: [DONE]\n\n"
    assert b"usage" not in b"".join(pieces)


def test_access_log_is_off_unless_asked_for() -> None:
    quiet, loud = AppConfig(), AppConfig(serve_access_log=True)
    for options in (router_options, replica_options):
        assert options(quiet)["logging_config"] == {"enable_access_log": False}
        assert options(loud)["logging_config"] == {"enable_access_log": True}


def test_router_code_runs_on_serves_loop_unless_asked_otherwise() -> None:
    on, off = router_options(AppConfig()), router_options(AppConfig(router_on_serve_loop=False))
    assert on["ray_actor_options"]["runtime_env"] == {"env_vars": {USER_CODE_THREAD_VAR: "0"}}
    assert "runtime_env" not in off["ray_actor_options"]  # Serve's default: a thread of its own
    assert "runtime_env" not in replica_options(AppConfig())["ray_actor_options"]  # routers only


class _Handle:
    def __init__(self) -> None:
        self.options_seen: list[dict] = []

    def options(self, **kw) -> _Handle:
        self.options_seen.append(kw)
        return self


def _runner(grpc: bool) -> _Handle:
    config = default_tenancy_config()
    handle = _Handle()
    quotas = QuotaManager(config, MemoryQuotaStore())
    dispatcher = Dispatcher(FairQueue.from_config(config), room_per_replica=2)
    timeouts = Timeouts(1.0, 1.0)
    RequestRunner(quotas, dispatcher, handle, ClusterMetrics(), TimingRecorder(), timeouts, grpc=grpc)  # type: ignore[arg-type]
    return handle


def test_replica_streams_use_grpc_unless_switched_off() -> None:
    assert AppConfig().handle_grpc is True
    # The Serve stream per request, and the unary call of the stream channel (its outputs on the channel)
    assert _runner(grpc=True).options_seen == [
        {"stream": True, "_by_reference": False},
        {"stream": False, "_by_reference": False},
    ]
    assert _runner(grpc=False).options_seen == [
        {"stream": True, "_by_reference": True},
        {"stream": False, "_by_reference": True},
    ]


def test_paced_replica_coalesces_like_the_replica_server() -> None:
    async def items(coalesce_s: float) -> list[dict]:
        replica = PacedReplica(step_s=0.002)
        args = GenerateArgs("r", [1, 2, 3], {"max_tokens": 20}, coalesce_s)
        return [item async for item in replica.generate(args)]

    single, batched = asyncio.run(items(0.0)), asyncio.run(items(0.01))
    assert len(single) == 20 and all(len(i["token_ids"]) == 1 for i in single)
    assert len(batched[0]["token_ids"]) == 1 and 2 < len(batched) < 20  # first at once, then ~5 per item
    for stream in (single, batched):
        assert sum(len(i["token_ids"]) for i in stream) == 20
        assert [i["finish_reason"] for i in stream][-1] == "length"
        assert stream[-1]["num_output_tokens"] == 20


def test_a_ray_started_here_tells_serve_whether_the_proxy_uses_grpc(monkeypatch) -> None:
    from cluster.ops.local_cluster import ray_env

    monkeypatch.setenv("RAY_SERVE_PROXY_USE_GRPC", "unset-marker")
    ray_env(proxy_grpc=None)  # joining a cluster: its own setting stays
    assert os.environ["RAY_SERVE_PROXY_USE_GRPC"] == "unset-marker"
    ray_env(proxy_grpc=False)
    assert os.environ["RAY_SERVE_PROXY_USE_GRPC"] == "0"
    ray_env(proxy_grpc=AppConfig().proxy_grpc)  # the default
    assert os.environ["RAY_SERVE_PROXY_USE_GRPC"] == "1"
