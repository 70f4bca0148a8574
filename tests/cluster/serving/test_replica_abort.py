"""A replica whose engine stops with requests in flight ends each of them with an explicit error
item (issue 19, defect 1), never with a finished-looking output."""

from __future__ import annotations

import asyncio

from cluster.serving.replica_deployment import ReplicaServer
from cluster.serving.wire import GenerateArgs


async def test_engine_stop_mid_stream_yields_an_error_item() -> None:
    server = ReplicaServer.__new__(ReplicaServer)
    await ReplicaServer.__init__(server, {"model": "smollm2-135m", "device": "cpu", "kv_cache_tokens": 2048})
    args = GenerateArgs(
        "stop-me", list(range(100, 140)), {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    )
    stream = server.generate(args)
    first = await anext(stream)
    assert first["token_ids"] and not first["done"]
    stopping = asyncio.create_task(server._engine.stop())
    items = [item async for item in stream]
    await stopping
    assert items and "error" in items[-1], items[-1:]
    assert items[-1]["error"]["kind"] == "aborted"
    assert all("error" in item or item["finish_reason"] is None for item in items)
