"""Streamed outputs leave the replica in time-based batches (``stream_interval_s``), without Ray:
the deployment class drives a real SmolLM2 engine on the CPU."""

from __future__ import annotations

import asyncio

from cluster.serving.replica_deployment import ReplicaServer
from cluster.serving.wire import GenerateArgs

PROMPT = [1, 504, 3458, 314, 253, 1789, 28, 30, 216]
SAMPLING = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}


async def _items(server: ReplicaServer, interval: float, request_id: str) -> list[dict]:
    return [item async for item in server.generate(GenerateArgs(request_id, PROMPT, SAMPLING, interval))]


def test_batched_stream_carries_the_same_tokens_in_fewer_items() -> None:
    async def run() -> tuple[list[dict], list[dict]]:
        server = ReplicaServer.__new__(ReplicaServer)
        await server.__init__({"model": "smollm2-135m", "device": "cpu", "max_num_seqs": 4})
        try:
            single = await _items(server, 0.0, "per-token")
            batched = await _items(server, 1.0, "batched")
        finally:
            await server._engine.stop()
        return single, batched

    single, batched = asyncio.run(run())
    assert all(len(item["token_ids"]) == 1 for item in single) and len(single) == 24
    assert len(batched[0]["token_ids"]) == 1  # the first token is never held back
    assert len(batched) < len(single)

    def tokens(items: list[dict]) -> list[int]:
        return [t for item in items for t in item["token_ids"]]

    assert tokens(batched) == tokens(single)
    assert "".join(i["text"] for i in batched) == "".join(i["text"] for i in single)
    assert batched[-1]["finish_reason"] == "length" and batched[-1]["num_output_tokens"] == 24
