"""One engine request's outputs, put on its router's stream channel as the engine delivers them.

The engine calls the relay on the replica's event loop with each step's outputs
(``replica.Engine.submit``): each one becomes a channel item there and then. A busy replica has a
hundred streams or more open, and passing every output through a queue, a task and two async
generators per request cost 1.4 ms of every 7-ms step at 128 streams on the H200 host, against
0.74 ms with the relay (``bench.replica_delivery``): time in which the replica takes in no new
request, answers no router, and holds the GIL the engine thread needs to launch its next step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.serving.stream_channel import RouterChannel
from cluster.serving.wire import ABORTED, OutputTally, error_item
from replica import InvalidRequestError, RequestOutput


class ChannelRelay:
    """The ``on_output`` of one request whose outputs travel on ``channel``; ``answer()`` is the
    replica call's answer once the request ended."""

    def __init__(self, channel: RouterChannel, replica_id: str, samples: int, request_id: str) -> None:
        self._channel = channel
        self._request_id = request_id
        self._tally = OutputTally(replica_id, samples)
        self.tokens = 0  # put on the channel so far
        # None once the last output is on the channel, or the request's error item.
        self.ended: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()

    def __call__(self, out: RequestOutput | Exception) -> None:
        if self.ended.done():
            return
        if isinstance(out, Exception):
            kind = "invalid_request" if isinstance(out, InvalidRequestError) else "engine_error"
            self.ended.set_result(error_item(kind, str(out)))
        elif out.finish_reason == "abort":  # the engine stopped (shutdown): not an answer
            self.ended.set_result(error_item("aborted", ABORTED))
        elif self._channel.broken is not None:  # the router is gone: the caller aborts the request
            failed = f"the router's stream channel failed: {self._channel.broken}"
            self.ended.set_result(error_item("channel_error", failed))
        else:
            item = self._tally.item(out)
            self._channel.put(item, urgent=self.tokens == 0 or item["done"])
            self.tokens += len(item["token_ids"])
            if item["done"]:
                self.ended.set_result(None)

    async def answer(self) -> dict[str, Any]:
        return await self._channel.answer(self._request_id, await self.ended, self.tokens)
