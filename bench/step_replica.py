"""A stand-in replica deployment without a model: a step every ``tpot_s`` gives each running request
the tokens due by then (token k at k + 1 TPOTs after it arrived), as an engine's decode step does for
its batch; the per-request schedule means a late step catches up instead of shifting every token.

Outputs leave as ``ReplicaServer``'s do: over the Serve stream (``generate``, at most one item per
``coalesce_s``, the first and the last at once) or on the router's stream channel
(``generate_channel``). With ``direct`` it also takes requests sent past Serve (direct dispatch:
``cluster/serving/submit_server.py``) and publishes where on the replica board, as a replica does.
Token k of a request is the word ``w{1000 + k}``, so a client can check that
every token arrived in order, once, and when it was due.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from cluster.serving import replica_board
from cluster.serving.stream_channel import ChannelSet
from cluster.serving.submit_server import SubmitServer
from cluster.serving.wire import GenerateArgs

FIRST_TOKEN_ID = 1000


class _Sequence:
    """Token k is due k + 1 steps after the request arrived; a late step catches up."""

    __slots__ = ("produced", "ready", "start", "wanted")

    def __init__(self, wanted: int, start: float) -> None:
        self.wanted = wanted
        self.start = start
        self.produced = 0
        self.ready = asyncio.Event()


class StepReplica:
    def __init__(self, tpot_s: float, max_model_len: int = 4096) -> None:
        self._tpot = tpot_s
        self._max_len = max_model_len
        self._running: dict[str, _Sequence] = {}
        self._stepper: asyncio.Task | None = None
        self._channels = ChannelSet()
        # The id its outputs and loads name. A Serve replica's must be its own: a router's slot on a
        # replica outside Serve's running set holds no room, so with "step" no stream counted.
        self.replica_id = "step"

    async def generate_channel(self, args: GenerateArgs) -> dict[str, Any]:
        return await self._channels.forward(args, self.generate(args))

    async def generate(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
        wanted = int(args.sampling["max_tokens"])
        seq = self._running[args.request_id] = _Sequence(wanted, asyncio.get_running_loop().time())
        if self._stepper is None:
            self._stepper = asyncio.get_running_loop().create_task(self._steps())
        sent, last = 0, 0.0
        try:
            while sent < wanted:
                await seq.ready.wait()
                seq.ready.clear()
                now = time.monotonic()
                if sent == 0 or seq.produced == wanted or now - last >= args.coalesce_s:
                    yield _item(args, sent, seq.produced, wanted, self.replica_id)
                    sent, last = seq.produced, now
        finally:
            self._running.pop(args.request_id, None)

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running:
            await asyncio.sleep(self._tpot)
            now = loop.time()
            for seq in self._running.values():
                due = min(seq.wanted, int((now - seq.start) / self._tpot))
                if due > seq.produced:
                    seq.produced = due
                    seq.ready.set()
        self._stepper = None

    def load(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "running": len(self._running),
            "waiting": 0,
            "waiting_tokens": 0,
        }

    def record_routing_stats(self) -> dict[str, Any]:
        running = len(self._running)
        # reported_at as the real replica's (``ReplicaServer.record_routing_stats``): without it a
        # router counts every send of the last 5 s as unreported, a cost the real path never pays.
        stats = {"kv_blocks_free": 1 << 20, "waiting": 0, "waiting_tokens": 0, "running": running}
        return stats | {"reported_at": time.time()}

    def profile(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id}

    def info(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "max_model_len": self._max_len, "kv_tokens": 1 << 20}


class BoardStepReplica(StepReplica):
    """The stand-in as a Serve deployment of the app: with ``direct`` it takes requests sent past
    Serve and publishes where on the replica board under the app's ``generation``."""

    async def __init__(
        self, tpot_s: float, generation: str = "", model: str = "", direct: bool = False
    ) -> None:
        from ray import serve

        super().__init__(tpot_s)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._submit: SubmitServer | None = None
        self._publisher: asyncio.Task | None = None
        if direct:
            import ray

            self._submit = SubmitServer(self.generate_channel, self.record_routing_stats)
            await self._submit.start(ray.util.get_node_ip_address())
            rid = self.replica_id
            self._publisher = asyncio.get_running_loop().create_task(self._publish(generation, rid, model))

    async def _publish(self, generation: str, rid: str, model: str) -> None:
        assert self._submit is not None
        where = {"model": model, "submit_address": self._submit.address, "submit_key": self._submit.key}
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(replica_board.publish, generation, rid, self.load() | where)
            await asyncio.sleep(replica_board.PUBLISH_EVERY_S)


def _item(args: GenerateArgs, sent: int, upto: int, wanted: int, replica_id: str) -> dict[str, Any]:
    ids = list(range(FIRST_TOKEN_ID + sent, FIRST_TOKEN_ID + upto))
    return {
        "request_id": args.request_id,
        "index": 0,
        "token_ids": ids,
        "text": "".join(f" w{t}" for t in ids),
        "finish_reason": "length" if upto == wanted else None,
        "num_prompt_tokens": len(args.prompt_ids),
        "num_output_tokens": upto,
        "total_output_tokens": upto,
        "done": upto == wanted,
        "replica_id": replica_id,
    }
