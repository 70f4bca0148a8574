"""One request's path through a router: admit → fair queue → dispatch → stream → release.

``RequestRunner.open`` runs everything up to the first output, so errors before the first token
(429, 400, 503) become HTTP statuses even for streamed requests. A replica that fails before the
first output is invisible to the client: the request is sent again (``retries`` times at most,
Serve, or direct dispatch, routes around the dead replica). After that, ``ActiveRequest``
streams and its ``close`` ends the request exactly once: it cancels the replica stream if still
open (the replica then aborts the engine request and frees its KV blocks), gives back the
dispatch slot, releases the quota lease with the real output tokens, and records the timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from ray.serve.handle import DeploymentHandle

from cluster.errors import BadRequest, ClusterError, ReplicaFailure, ServiceUnavailable
from cluster.routing import request_ends
from cluster.routing.direct_dispatch import DirectDispatch
from cluster.routing.dispatcher import Dispatcher, DispatchSlot
from cluster.routing.outcomes import outcome_of, replica_timeout, stream_failure
from cluster.routing.request_job import Job, Timeouts
from cluster.routing.stream_receiver import ChannelStream, StreamReceiver
from cluster.serving.wire import GenerateArgs
from cluster.telemetry.inter_token import InterTokenGaps
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import Outcome, RequestTiming, TimingRecorder
from tenancy import Lease, QuotaManager

RENEW_EVERY_S = 300.0  # well inside the shared store's lease TTL (900 s)
RETRY_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 2.0)  # lets Serve's replica set catch up with a dead replica
MAX_STREAM_INTERVAL_S = 1.0  # the coarsest item spacing a stream gets, however many are open


def stream_interval(floor_s: float, open_streams: int, items_per_s: float) -> float:
    """Seconds between one stream's items: ``floor_s``, or the router's item budget shared out.

    Each stream item costs the router (and the proxy) a fixed slice of CPU whatever it carries, so
    a router with many long streams open spends most of its time on items. Sharing a fixed budget of
    items per second over the open streams bounds that cost; the tokens all arrive, in larger items.
    """
    if items_per_s <= 0:
        return floor_s
    return max(floor_s, min(MAX_STREAM_INTERVAL_S, open_streams / items_per_s))


def channel_flush(ceiling_s: float, open_streams: int, items_per_s: float) -> float:
    """How long a replica may hold a stream's outputs on the channel: none while the router's item
    budget covers an item per stream and engine step, then the budget shared out over the open
    streams, up to ``ceiling_s`` (``stream_flush_s``). ``items_per_s`` 0: no budget, never held."""
    if items_per_s <= 0:
        return 0.0
    return min(ceiling_s, open_streams / items_per_s)


class RequestRunner:
    """Runs jobs against the replica deployment; one per router."""

    def __init__(
        self,
        quotas: QuotaManager,
        dispatcher: Dispatcher,
        replicas: DeploymentHandle,
        metrics: ClusterMetrics,
        recorder: TimingRecorder,
        timeouts: Timeouts,
        grpc: bool = False,
        stream_items_per_s: float = 0.0,
        model: str = "",
    ) -> None:
        """``model``: the served model whose replicas ``replicas`` reaches (recorded with each request)."""
        self.quotas = quotas
        self.model = model
        self.dispatcher = dispatcher
        # grpc: the streams travel over Serve's inter-deployment gRPC channel instead of Ray actor
        # calls (``_by_reference=False``), which costs the router and the replica less CPU per item.
        self._replicas = replicas.options(stream=True, _by_reference=not grpc)
        self._calls = replicas.options(stream=False, _by_reference=not grpc)
        # With a channel (``attach_channel``), outputs come back on the router's stream channel,
        # one frame per replica per flush for all streams, instead of one Serve item per output.
        self.channel: StreamReceiver | None = None
        self.flush_s = 0.02  # the ceiling of the replicas' hold on the channel (stream_flush_s)
        self.flush_now_s = 0.0  # the hold asked of the latest request (the item budget's share)
        # With direct dispatch (``direct_dispatch.py``) requests skip Serve's handle when a replica
        # is reachable; their outputs still come back on the channel.
        self.direct: DirectDispatch | None = None
        self.metrics = metrics
        self.recorder = recorder
        self.timeouts = timeouts
        self._items_per_s = stream_items_per_s

    def attach_channel(self, channel: StreamReceiver, flush_s: float) -> None:
        self.channel, self.flush_s = channel, flush_s

    async def open(self, job: Job, key_id: str = "", received: float | None = None) -> ActiveRequest:
        """Admit, wait for a fair turn, dispatch and wait for the first output. ``key_id``: the
        caller's API key id, for the ledger's row; ``received``: when its HTTP request entered the
        router (``edge/received_stamp.py``), for the timing record."""
        timing = RequestTiming(
            job.request_id,
            job.tenant.id,
            job.sla_class,
            time.monotonic(),
            prompt_tokens=len(job.prompt_ids),
            model=self.model,
            adapter=job.adapter,
            key_id=key_id,
            user=job.user,
            received=received,
        )
        active = ActiveRequest(self, self.quotas, job, timing)
        try:
            active.lease = await self.quotas.admit(
                job.tenant,
                len(job.prompt_ids),
                job.max_tokens,
                request_id=job.request_id,
                choices=job.choices,
            )
            timing.admitted = time.monotonic()
            queued = self.dispatcher.queue.make_request(
                job.request_id, job.tenant.id, len(job.prompt_ids), job.max_tokens, timing.arrival
            )
            active.priority = queued.tier
            active.slot = await self.dispatcher.wait_turn(queued)
            await asyncio.sleep(0)  # a granted slot does not suspend: dispatch in a step of its own
            timing.dispatched = time.monotonic()
            await self._first_output(active)
        except BaseException as exc:
            await active.close(*outcome_of(exc))
            raise
        return active

    def _dispatch(self, active: ActiveRequest, engine_id: str, coalesce_s: float):
        """Send the request to a replica (Serve or direct dispatch picks it); its stream of outputs.
        The request's tier in the fair queue (``active.priority``) goes along: the engine schedules by it."""
        job, priority = active.job, active.priority
        if self.channel is None:
            args = GenerateArgs(
                engine_id,
                job.prompt_ids,
                job.sampling,
                coalesce_s,
                tenant=job.tenant.id,
                cache_group=job.tenant.cache_group,
                cache_salt=job.cache_salt,
                priority=priority,
                adapter=job.adapter,
                adapter_path=job.adapter_path,
            )
            return self._replicas.generate.remote(args)
        # On the channel every output waits at most one flush: the frame is shared by all streams,
        # so spacing one stream's outputs further saves nothing. The flush follows the item budget:
        # each output leaves as the engine makes it until the open streams need coalescing. (The
        # channel's open streams, not the dispatcher's slots: a slot on a replica outside Serve's
        # running set holds no room, and its stream still costs an item per flush.)
        self.flush_now_s = channel_flush(self.flush_s, self.channel.open_streams + 1, self._items_per_s)
        args = GenerateArgs(
            engine_id,
            job.prompt_ids,
            job.sampling,
            0.0,
            tenant=job.tenant.id,
            cache_group=job.tenant.cache_group,
            cache_salt=job.cache_salt,
            priority=priority,
            reply_to=self.channel.address,
            channel_key=self.channel.key,
            flush_s=self.flush_now_s,
            adapter=job.adapter,
            adapter_path=job.adapter_path,
        )
        call = self.direct.submit(args) if self.direct is not None else None
        active.via_serve = call is None
        if call is None:
            call = self._calls.generate_channel.remote(args)
        return self.channel.open(engine_id, call)

    async def _first_output(self, active: ActiveRequest) -> None:
        """Open the replica stream and read its first output, re-dispatching after a replica failure.

        Only failures of the replica itself are retried: nothing reached the client yet, so a new
        attempt (under a fresh engine request id) is invisible to it. Timeouts are not retried; the
        wait was already spent.
        """
        job = active.job
        coalesce_s = stream_interval(job.coalesce_s, self.dispatcher.in_flight, self._items_per_s)
        for attempt in range(self.timeouts.first_token_retries + 1):
            engine_id = job.request_id if attempt == 0 else f"{job.request_id}-r{attempt}"
            active.engine_id = engine_id
            active.stream = self._dispatch(active, engine_id, coalesce_s)
            try:
                active.first = await active.next_item(self.timeouts.first_token_s)
                return
            except ReplicaFailure:
                if attempt == self.timeouts.first_token_retries:
                    raise
            active.stream.cancel()
            active.retries += 1
            self.metrics.retries.labels(job.tenant.id, job.sla_class).inc()
            await asyncio.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])


class ActiveRequest:
    """A dispatched request: iterate its outputs, then (or on any failure) ``close`` it."""

    def __init__(self, runner: RequestRunner, quotas: QuotaManager, job: Job, timing: RequestTiming) -> None:
        self._runner = runner
        self._quotas = quotas  # the manager that admitted it, even if the config is reloaded meanwhile
        self.job = job
        self.timing = timing
        self.lease: Lease | None = None
        self.slot: DispatchSlot | None = None
        self.priority = 0  # its tier in the fair queue (the dispatch policy's), sent to the engine
        self.stream = None
        self.engine_id = ""  # the id of its latest dispatch (a retry gets a fresh one)
        self.via_serve = True  # sent through Serve's handle (else direct dispatch, which counts its own ends)
        self.first: dict[str, Any] | None = None
        self.retries = 0
        self.gaps = InterTokenGaps()
        self._count_tokens = runner.metrics.token_counter(timing.tenant_id, timing.sla_class)
        self._finished = False
        self._closed = False

    async def outputs(self) -> AsyncIterator[dict[str, Any]]:
        """Every output item, the first included; the request is closed when this ends."""
        outcome: tuple[Outcome, str | None] = ("aborted", "client_gone")
        try:
            item = self.first
            last_renew = time.monotonic()
            while item is not None:
                yield item
                if item["done"]:
                    outcome = ("ok", item["finish_reason"])
                    break
                if self.lease is not None and time.monotonic() - last_renew > RENEW_EVERY_S:
                    last_renew = time.monotonic()
                    await self.renew_lease()
                item = await self.next_item(self.token_timeout_s)
        except BaseException as exc:
            outcome = outcome_of(exc)
            raise
        finally:
            await self.close(*outcome)

    async def next_item(self, timeout_s: float) -> dict[str, Any]:
        """The next replica output; errors in the stream become typed exceptions."""
        try:
            if isinstance(self.stream, ChannelStream):  # its own timeout: no task per output
                item = await self.stream.next(timeout_s)
            else:
                async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can swallow a cancel
                    item = await self.stream.__anext__()
        except TimeoutError:
            raise replica_timeout() from None
        except StopAsyncIteration:
            raise ReplicaFailure("the replica ended the stream early") from None
        except ClusterError:
            raise
        except Exception as exc:
            raise stream_failure(exc) from exc
        return self.checked(item)

    def checked(self, item: dict[str, Any]) -> dict[str, Any]:
        """A replica output, counted; an error item or an aborting output raises its typed error."""
        error = item.get("error")
        if error is not None:
            if error["kind"] == "invalid_request":
                raise BadRequest(error["message"], code="invalid_prompt")
            if error["kind"] == "aborted":  # the replica is stopping: another one can take it
                raise ReplicaFailure(error["message"])
            raise ServiceUnavailable(error["message"], code="engine_error")
        if item["done"] and item["finish_reason"] == "abort":  # a replica that says so in an output
            raise ReplicaFailure("the replica stopped before the request finished")
        self._on_tokens(item)
        return item

    async def renew_lease(self) -> None:
        """Keep a long stream's quota lease alive (``RENEW_EVERY_S``)."""
        if self.lease is not None:
            await self._quotas.renew(self.lease)

    @property
    def token_timeout_s(self) -> float:
        return self._runner.timeouts.token_s

    def _on_tokens(self, item: dict[str, Any]) -> None:
        t = self.timing
        new = item["total_output_tokens"] - t.output_tokens
        if t.first_token is None and item["token_ids"]:
            t.first_token = time.monotonic()
        t.replica_id = item.get("replica_id", t.replica_id)
        if self.slot is not None:
            self.slot.placed_on(t.replica_id)
        t.cached_tokens = item.get("num_cached_tokens", t.cached_tokens)
        if new > 0:
            self.gaps.add(time.monotonic(), new)
            t.output_tokens = item["total_output_tokens"]
            self._count_tokens(new)
        if "engine_ttft_s" in item:  # on a choice's last output
            t.engine_queue, t.engine_ttft = item["engine_queue_s"], item["engine_ttft_s"]
        if item["done"]:
            self._finished = True

    async def close(self, outcome: Outcome, reason: str | None = None) -> None:
        """End the request once: cancel the stream, free the slot, settle the lease, record."""
        if self._closed:
            return
        self._closed = True
        t = self.timing
        if self.stream is not None and not self._finished:
            self.stream.cancel()  # Serve cancels the replica generator → the engine aborts the request
        if self.slot is not None:  # settles the fair-share charge with what the request used
            self.slot.release(t.output_tokens, t.cached_tokens)
        if t.replica_id is not None and self.via_serve:  # Serve's replica choice stops counting it
            request_ends.record(t.replica_id, self.engine_id)
        # Record before the one await below: a handler cancelled again while it awaits must not
        # lose the record (the ending would then be counted nowhere).
        t.end = time.monotonic()
        t.outcome, t.reason = outcome, reason
        if t.first_token is None and outcome == "ok":
            t.first_token = t.end  # zero-token completion: first "token" is the end
        t.itl_p99 = self.gaps.percentile(99)
        self._runner.recorder.add(t)
        self._runner.metrics.observe_end(t)
        if self.lease is not None:
            # Shielded: a cancelled handler must still give the concurrency slot back.
            await asyncio.shield(self._quotas.release(self.lease, t.output_tokens))
