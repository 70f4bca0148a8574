"""The replica deployment: one ``replica.Engine`` per Serve replica, streamed through a deployment handle.

An engine that ends a request with "abort" (it is stopping) yields an ``aborted`` error item: the
router retries it elsewhere before the first token and reports a failure after it.

A router with a stream channel (the default, ``stream_channel``) calls ``generate_channel``: one unary
call per request, its outputs on the channel shared by all of that router's streams. Otherwise every
generation is a streaming method (``handle.options(stream=True).generate.remote(...)``) that
yields plain dicts, so nothing engine-specific has to be pickled across the handle. Invalid input
is yielded as an ``{"error": ...}`` item instead of raised, because exceptions crossing a Ray
boundary are wrapped and lose their type. When the caller cancels the stream (client gone), Serve
cancels this generator; leaving ``engine.generate`` early aborts the request and frees its KV
blocks (the engine's own ``finally``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from cluster.serving import replica_board
from cluster.serving.channel_relay import ChannelRelay
from cluster.serving.engine_load_policy import ENGINE_REQUESTS
from cluster.serving.replica_adapters import ReplicaAdapters
from cluster.serving.sla_replica_stats import measured_start, sla_stats
from cluster.serving.stream_channel import ChannelSet
from cluster.serving.submit_server import SubmitServer
from cluster.serving.wire import ABORTED, GenerateArgs, OutputTally, error_item, merge_items
from cluster.telemetry.gc_pauses import PROCESS_GC, settle_for_serving
from cluster.telemetry.process_memory import rss_bytes
from cluster.text.word_tokenizer import attach_to_engine, word_tokenizer
from replica import EngineConfig, EngineError, InvalidRequestError, RequestOutput, SamplingParams

log = logging.getLogger(__name__)

SUMMARY_EVERY_S = 0.5  # the routers' stats period (cluster.app.ROUTING_STATS_PERIOD_S)
# A stopping replica's wait for directly sent requests when no bound is given; the app passes its
# graceful_shutdown_s, Serve's own cap on the stop, so a drain never ends before Serve would kill it.
DIRECT_DRAIN_S = 60.0


class ReplicaServer:
    """A Serve deployment class (decorated by ``cluster.app``) that owns one engine."""

    async def __init__(
        self,
        engine: dict[str, Any],
        synthetic_tokenizer: bool = False,
        generation: str | None = None,
        model: str = "",
        direct_dispatch: bool = False,
        sla_autoscaling: bool = False,
        drain_s: float = DIRECT_DRAIN_S,
    ) -> None:
        """``generation``: the app deployment's id; with it the replica publishes its load every
        second (``cluster/serving/replica_board.py``). ``model``: the served name, in every load.
        ``direct_dispatch``: routers also send requests on connections of their own
        (``submit_server.py``); the address and key are published with the load. ``sla_autoscaling``:
        the SLA policy reads this replica's hook (``sla_replica_stats.py``). ``drain_s``: how long a
        stopping replica waits for its direct streams (the deployment's ``graceful_shutdown_timeout_s``)."""
        from replica.engine import Engine  # here: torch loads in replica processes, never in routers

        loading = time.monotonic()
        self._engine = Engine(EngineConfig(**engine))
        await self._engine.start()
        # What a new replica costs before it serves (the SLA policy's start time): load + graph capture,
        # and from the process's start, which adds Ray's actor start and the imports.
        self._load_s = time.monotonic() - loading
        self._start_s = measured_start(self._load_s)
        self._adapters = ReplicaAdapters(self._engine)
        if synthetic_tokenizer:  # the router encodes with the same one (cluster.text.prompts)
            attach_to_engine(self._engine, word_tokenizer(self._engine.loaded.config.vocab_size))
        self._replica_id = _replica_id()
        self._model = model
        self._started = time.monotonic()
        self._generation = generation
        self._drain_s = drain_s
        self._summary: dict[str, Any] | None = None
        self._summary_at: float | None = None
        self._publisher: asyncio.Task | None = None
        self._channels = ChannelSet()
        self._submit: SubmitServer | None = None
        if direct_dispatch:
            # Serve looks this hook up on the instance after __init__: only under direct dispatch,
            # whose policy reads it, does a replica push it (Serve's own path stays as it was).
            self.record_autoscaling_stats = self.engine_requests
        if sla_autoscaling:
            self.record_autoscaling_stats = self.sla_stats
        if direct_dispatch:
            import ray

            self._submit = SubmitServer(self.generate_channel, self.routing_stats_wire)
            await self._submit.start(ray.util.get_node_ip_address())
        if generation is not None:
            self._publisher = asyncio.get_running_loop().create_task(self._publish(generation))
        # torch, the model's modules and the engine's start-up objects live as long as the replica:
        # frozen, no full collection walks them again (it would stall the engine thread's steps).
        settle_for_serving()
        PROCESS_GC.install()

    async def generate(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
        """Stream one request's outputs as dicts; the last one has ``finish_reason`` set."""
        params = _sampling_params(args)
        if isinstance(params, dict):
            yield params
            return
        started = False
        try:
            if args.adapter is not None:
                await self._adapters.ensure(args.adapter, args.adapter_path)
            stream = self._engine.generate(
                args.prompt_ids,
                params,
                request_id=args.request_id,
                cache_scope=args.cache_scope(),
                priority=args.priority,
                adapter=args.adapter,
            )
            held: dict[int, dict[str, Any]] = {}  # per choice, outputs not sent yet
            tally = OutputTally(self._replica_id, params.n)
            last_yield = 0.0
            async for out in stream:
                if out.finish_reason == "abort":  # the engine stopped (shutdown): not an answer
                    for ready in held.values():
                        yield ready
                    yield error_item("aborted", ABORTED)
                    return
                item = tally.item(out)
                held[out.index] = merge_items(held[out.index], item) if out.index in held else item
                now = time.monotonic()
                if not started or out.finished or now - last_yield >= args.coalesce_s:
                    started = True
                    for ready in _in_order(held, item):
                        yield ready
                    held, last_yield = {}, now
        except InvalidRequestError as exc:
            yield error_item("invalid_request", str(exc))
        except EngineError as exc:
            yield error_item("engine_error", str(exc))

    async def generate_channel(self, args: GenerateArgs) -> dict[str, Any]:
        """One request whose outputs travel on the stream channel to ``args.reply_to`` (one frame per
        flush for all of that router's streams): each step's outputs go onto the channel as the
        engine delivers them (``channel_relay.py``). Answers when the last output is written, or with
        the request's error item. Cancelled (client gone): the engine request is aborted."""
        params = _sampling_params(args)
        if isinstance(params, dict):
            return params
        channel = self._channels.channel(args.reply_to, args.channel_key, args.flush_s)
        relay = ChannelRelay(channel, self._replica_id, params.n, args.request_id)
        try:
            if args.adapter is not None:
                await self._adapters.ensure(args.adapter, args.adapter_path)
            request = await self._engine.submit(
                args.prompt_ids,
                params,
                relay,
                args.request_id,
                args.cache_scope(),
                args.priority,
                args.adapter,
            )
        except InvalidRequestError as exc:
            return error_item("invalid_request", str(exc))
        except EngineError as exc:
            return error_item("engine_error", str(exc))
        try:
            await relay.ended
        finally:
            request.cancel()  # still producing (the call was cancelled, or its router left): abort it
        return await relay.answer()

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_adapter(self, name: str, path: str) -> str | None:
        """``POST /admin/adapters``' check: None when this replica's engine serves the adapter."""
        return await self._adapters.check(name, path)

    def load(self) -> dict[str, Any]:
        """Running/waiting requests and free KV blocks of this replica's engine."""
        s = self._engine.stats()
        return {
            "replica_id": self._replica_id,
            "model": self._model,
            "running": s.running,
            "waiting": s.waiting,
            "waiting_tokens": self._engine.waiting_tokens,  # uncached prompt + answer budget
            "kv_blocks_total": s.kv_blocks_total,
            "kv_blocks_used": s.kv_blocks_used,
            "kv_blocks_free": s.kv_blocks_free,
            "num_preemptions": s.num_preemptions,
            "output_tokens_per_s": s.output_tokens_per_s,
            "prompt_tokens": s.prompt_tokens,  # since start, and of those found in the prefix cache
            "cached_prompt_tokens": s.cached_prompt_tokens,
            "kv_blocks_cached": s.kv_blocks_cached,
            "kv_evictions": s.kv_evictions,
            "rss_bytes": rss_bytes(),
            "gc": PROCESS_GC.snapshot(),  # the collector's pauses since start (the engine thread waits)
            "engine": self._engine.describe(),  # device, dtype and sizes: the routers' room follows them
            "start_s": self._start_s,  # process start → serving (the SLA policy's start time)
            "load_s": self._load_s,  # the engine's part: load + graph capture
        }

    async def sla_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics under the SLA policy (``sla_metrics.py``): the routers'
        class loads for this deployment, the engine's running + waiting requests and its recent
        steps' pace, the start time."""
        import ray.serve

        ctx = ray.serve.get_replica_context()
        s = self._engine.stats()
        running, pace = float(s.running + s.waiting), self._engine.step_pace()
        stats = await sla_stats(ctx.app_name, ctx.deployment, running, self._start_s, pace)
        return stats | self.engine_requests()

    def engine_requests(self) -> dict[str, float]:
        """Serve's custom autoscaling metric (``engine_load_policy.py``): what the engine holds,
        whichever way the requests came (direct dispatch is invisible to Serve's own counts)."""
        s = self._engine.stats()
        return {ENGINE_REQUESTS: float(s.running + s.waiting)}

    def record_routing_stats(self) -> dict[str, Any]:
        """Read by ``cluster.routing.kv_router.KVAwareRouter``: free KV, queued tokens, and a summary of
        the prefix cache (``replica/cache_summary.py``) for the prefix-aware choice. ``reported_at``
        lets a router tell which of the requests it sent this report already counts."""
        load = self.load()
        stats = {k: load[k] for k in ("kv_blocks_free", "waiting", "waiting_tokens", "running")}
        stats["reported_at"] = time.time()
        stats["prefix_summary"] = self._prefix_summary()
        stats["adapters"] = self._adapters.resident()
        return stats

    def routing_stats_wire(self) -> dict[str, Any]:
        """``record_routing_stats`` for a direct-dispatch router: the summary's bits in base64 (the
        frames are JSON), and when the summary was built, so a router decodes each one once."""
        stats = self.record_routing_stats()
        summary = stats["prefix_summary"]
        if summary is not None:
            stats["prefix_summary"] = {**summary, "bits": base64.b64encode(summary["bits"]).decode()}
        stats["summary_at"] = self._summary_at
        return stats

    def _prefix_summary(self) -> dict[str, Any] | None:
        """The cache summary, rebuilt at most every SUMMARY_EVERY_S however many routers poll (an 8B
        replica's takes ~15 ms to build)."""
        now = time.monotonic()
        if self._summary_at is None or now - self._summary_at >= SUMMARY_EVERY_S:
            summary = self._engine.cache_summary()
            self._summary = None if summary is None else summary.as_dict()
            self._summary_at = now
        return self._summary

    def profile(self) -> dict[str, Any]:
        """The engine's step-time breakdown, plus this replica's id."""
        return {
            "replica_id": self._replica_id,
            "model": self._model,
            **self._engine.profile_summary(),
            "gc": PROCESS_GC.snapshot(),
        }

    def info(self) -> dict[str, Any]:
        """Static facts of this replica's engine: device, dtype, context limit and sizes (KV tokens among
        them); the routers read the context limit, ``fairlane serve`` prints the rest."""
        return {"replica_id": self._replica_id, **self._engine.describe()}

    async def check_health(self) -> None:
        if not self._engine.running:
            raise RuntimeError("the engine loop has stopped")

    async def _publish(self, generation: str) -> None:
        while True:
            try:
                load = self.load()
                if self._submit is not None:  # how routers reach it with direct dispatch
                    load |= {"submit_address": self._submit.address, "submit_key": self._submit.key}
                await asyncio.to_thread(replica_board.publish, generation, self._replica_id, load)
            except Exception as exc:  # the GCS busy or gone: the next second tries again
                log.debug("replica load not published: %s", exc)
            await asyncio.sleep(replica_board.PUBLISH_EVERY_S)

    async def __del__(self) -> None:
        # Serve awaits an async destructor on shutdown: stop the engine thread cleanly. Requests sent
        # directly are not Serve's, so Serve's graceful drain did not wait for them: wait here.
        # A replica whose __init__ failed partway is destroyed too: stop only what it had made.
        submit, channels = getattr(self, "_submit", None), getattr(self, "_channels", None)
        if submit is not None:
            await submit.drain(getattr(self, "_drain_s", DIRECT_DRAIN_S))
            await submit.stop()
        if channels is not None:
            await channels.close()
        if getattr(self, "_publisher", None) is not None:
            self._publisher.cancel()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(replica_board.forget, self._generation, self._replica_id)
        if getattr(self, "_engine", None) is not None:
            await self._engine.stop()


def _in_order(held: dict[int, dict[str, Any]], newest: dict[str, Any]) -> list[dict[str, Any]]:
    """Held outputs to send, the newest last (it carries the request's latest total and `done`)."""
    others = [item for index, item in sorted(held.items()) if index != newest["index"]]
    for item in others:  # their totals were current when made; the newest's supersede them
        item["total_output_tokens"] = min(item["total_output_tokens"], newest["total_output_tokens"])
        item["done"] = False
    return [*others, held[newest["index"]]]


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (unit use): the process id is unique enough
        return f"pid-{os.getpid()}"


def engine_output(item: dict[str, Any]) -> RequestOutput:
    """Rebuild an engine ``RequestOutput`` from a streamed dict (for tests and tools)."""
    return RequestOutput(
        request_id=item["request_id"],
        token_ids=item["token_ids"],
        text=item["text"],
        finish_reason=item["finish_reason"],
        num_prompt_tokens=item["num_prompt_tokens"],
        num_output_tokens=item["num_output_tokens"],
        index=item.get("index", 0),
    )


def _sampling_params(args: GenerateArgs) -> SamplingParams | dict[str, Any]:
    """The request's sampling parameters, or the ``invalid_request`` item that answers bad ones."""
    try:
        return SamplingParams(**args.sampling)
    except (InvalidRequestError, TypeError) as exc:
        return error_item("invalid_request", str(exc))
