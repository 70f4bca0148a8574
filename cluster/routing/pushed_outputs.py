"""A streamed request's outputs pushed to a callback as the router reads them off the channel.

``ActiveRequest.outputs`` is pulled: for each output the receiver puts it in the request's queue,
the handler's task wakes, and the output climbs a stack of async generators to the response. That
is a task wake and several generator frames per output of every open stream. Pushed, the receiver
calls ``consume`` with each output right where it reads the replica's frame (``ChannelStream.push``);
the handler's task sleeps until the request ends, waking only for the token timeout and the quota
lease's renewal. The checks and counts per output are the pulled path's (``ActiveRequest.checked``),
and the request is closed exactly once, with the same outcome.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from cluster.routing.outcomes import outcome_of, replica_timeout, stream_failure
from cluster.routing.request_flow import RENEW_EVERY_S, ActiveRequest
from cluster.routing.stream_receiver import ChannelStream


def can_push(active: Any) -> bool:
    """Only a single request on the stream channel is pushed (Serve streams and batches are pulled)."""
    return isinstance(active, ActiveRequest) and isinstance(active.stream, ChannelStream)


class PushedOutputs:
    """Runs one request's outputs into ``consume``; ``run`` returns when its last output was consumed
    and raises what ended it otherwise (as ``outputs`` would, from the handler's task)."""

    def __init__(self, active: ActiveRequest, consume: Callable[[dict[str, Any]], None]) -> None:
        self._active = active
        self._consume = consume
        self._ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self._last_output = time.monotonic()

    async def run(self) -> None:
        active = self._active
        outcome: tuple[Any, str | None] = ("aborted", "client_gone")
        try:
            first = active.first
            assert first is not None and isinstance(active.stream, ChannelStream)
            self._consume(first)
            if not first["done"]:
                active.stream.push(self._on_item, self._on_failure)
                await self._until_end()
            outcome = ("ok", self._finish_reason(first))
        except BaseException as exc:
            outcome = outcome_of(exc)
            raise
        finally:
            if self._ended.done() and not self._ended.cancelled():
                self._ended.exception()  # retrieved: a handler cancelled meanwhile logs nothing
            await active.close(*outcome)

    def _finish_reason(self, first: dict[str, Any]) -> str | None:
        return first["finish_reason"] if first["done"] else self._ended.result()

    def _on_item(self, item: dict[str, Any]) -> None:
        if self._ended.done():
            return
        try:
            self._consume(self._active.checked(item))
        except Exception as exc:
            self._ended.set_exception(exc)
            return
        self._last_output = time.monotonic()
        if item["done"]:
            self._ended.set_result(item["finish_reason"])

    def _on_failure(self, exc: Exception) -> None:
        if not self._ended.done():
            self._ended.set_exception(stream_failure(exc))

    async def _until_end(self) -> None:
        """Sleep until the last output; wake only to enforce the token timeout and renew the lease."""
        timeout_s = self._active.token_timeout_s
        last_renew = time.monotonic()
        while True:
            now = time.monotonic()
            wait_s = min(self._last_output + timeout_s, last_renew + RENEW_EVERY_S) - now
            await asyncio.wait([self._ended], timeout=max(wait_s, 0.0))
            if self._ended.done():
                self._ended.result()  # raises what ended it
                return
            now = time.monotonic()
            if now - self._last_output >= timeout_s:
                raise replica_timeout()
            if now - last_renew >= RENEW_EVERY_S:
                last_renew = now
                await self._active.renew_lease()
