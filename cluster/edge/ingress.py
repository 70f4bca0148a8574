"""The HTTP ingress: OpenAI routes, health, metrics, SLA reports and admin, under ``serve.ingress``."""

import asyncio
import logging
import threading
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from cluster.config import AppConfig
from cluster.drain import RouterDrain
from cluster.edge import api_docs, ledger_views, stream_responses
from cluster.edge.adapter_admin import AdapterAdmin, AdapterRegistration, card, listing
from cluster.edge.answers import answer
from cluster.edge.body_limit import BodyLimit
from cluster.edge.early_abort import record_client_gone
from cluster.edge.finite_json import FiniteJSON
from cluster.edge.model_jobs import job_builders
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.edge.prompt_batch import open_all
from cluster.edge.received_stamp import RECEIVED_KEY, ReceivedStamp
from cluster.edge.request_ids import new_request_id
from cluster.edge.router_state import engine_figures, health, models_state, totals
from cluster.edge.tenant_views import check_own
from cluster.errors import Draining, Forbidden, error_response
from cluster.ledger.backpressure import LedgerFull
from cluster.ledger.rows import key_id as api_key_id
from cluster.routing.live_replicas import live_replicas
from cluster.routing.model_pool import ModelPool
from cluster.routing.replica_monitor import MonitorLoop, ReplicaMonitor, running_counts, running_replicas
from cluster.routing.router_core import RouterCore
from cluster.routing.stream_receiver import StreamReceiver
from cluster.routing.tenancy_sync import Deployment, TenancySync
from cluster.serving import replica_board
from cluster.serving.sla_publisher import SlaPublisher
from cluster.telemetry.gc_pacer import GcPacer, pacing_wanted
from cluster.telemetry.gc_pauses import PROCESS_GC, settle_for_serving
from cluster.telemetry.loop_holds import LoopHolds
from cluster.telemetry.loop_lag import LoopLag
from cluster.telemetry.process_memory import rss_bytes
from cluster.telemetry.status_metrics import StatusMetrics
from tenancy import Tenant, parse_bearer

ROUTER_DEPLOYMENT = "Router"
log = logging.getLogger(__name__)
api = FastAPI(title="fairlane", docs_url=None, redoc_url=None)
# The router sets the limit when it starts; until then (and outside Serve) no limit applies.
api.add_middleware(BodyLimit, limit=lambda: getattr(api.state, "max_body_bytes", None))
# Outside the body limit, so it also counts its 413s.
api.add_middleware(StatusMetrics, counter=lambda: getattr(api.state, "http_errors", None))
api.add_middleware(ReceivedStamp)  # outermost: the request's entry into the router's app


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(exc)


@api.exception_handler(HTTPException)
async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return error_response(exc)


def _card(model: str) -> dict[str, Any]:
    """An OpenAI model object."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "fairlane"}


# Above the class: serve.ingress serializes the routes (and the globals they use) as it decorates.
@serve.ingress(api)
class Ingress:
    """One router: authenticates, admits, queues fairly, dispatches and streams."""

    async def __init__(
        self, replicas: dict[str, DeploymentHandle], config: dict[str, Any], generation: str = ""
    ) -> None:
        """``replicas``: each served model's replica deployment; ``generation``: the id of this
        deployment of the app (``cluster.app.compose``)."""
        self.cfg = AppConfig.model_validate(config)
        api.state.max_body_bytes = self.cfg.max_body_bytes
        self.replicas = replicas
        self.generation = generation
        ctx = serve.get_replica_context()
        self.router_id = ctx.replica_id.unique_id
        self.tenancy_sync = self._tenancy_sync(ctx.app_name, generation)
        self.core = RouterCore(self.cfg, replicas, (await self.tenancy_sync.initial()).config)
        self.channel = StreamReceiver()
        if self.cfg.stream_channel:  # replicas connect to this node's address (docs/cluster.md)
            await self.channel.start(ray.util.get_node_ip_address())
            self.core.attach_channel(self.channel)
        if self.cfg.direct_dispatch:  # requests go straight to the replicas on the board
            self.core.start_direct_dispatch(self._read_board, lambda model: self._live(ctx.app_name, model))
        self.loop_lag = LoopLag()  # /admin/state's loop_lag: how late a probe woke (load included)
        self.loop_lag.start()
        self.loop_holds = LoopHolds()  # /admin/state's loop_holds: the longest single callbacks
        if self.cfg.loop_holds:  # off by default: it costs a Python-level step per task step
            self.loop_holds.start()
        api.state.http_errors = self.core.metrics.http_errors
        self.jobs = job_builders(self.cfg, replicas)
        self.adapter_admin = AdapterAdmin(self.core.adapters, replicas, ctx.app_name, generation)
        await self.adapter_admin.poll()  # adapters registered before this router started
        self.core.metrics.router_info.labels(self.router_id).set(1)
        self.drain = RouterDrain(ctx.app_name, self.router_id, lambda: self.core.held)
        self.ledger = ledger_views.start_ledger(self.cfg, ctx.app_name, self.router_id, self.core)
        await self.core.warm_stores()
        self.monitor = MonitorLoop(
            [self._replica_monitor(ctx.app_name, pool) for pool in self.core.pools.values()],
            self.core.recorder,
            self.cfg.load_poll_interval_s,
            hooks=(
                self.drain.poll,
                self.core.probe_stores,
                self.tenancy_sync.poll,
                self.adapter_admin.poll,
                *self._sla_hooks(ctx.app_name),
            ),
        )
        self.monitor.start()
        self.core.start_counter_sync(self.cfg.counter_sync_s)
        # Start-up's objects (imports, config, tokenizer) live as long as the router: frozen, no full
        # collection walks them again (127-161 ms, a pause of every stream, on the CPU box).
        settle_for_serving()
        PROCESS_GC.install()
        # Young collections bounded by a clock (by count alone, one walks every stream born since) and
        # full ones when few requests are held (gc_pacer.py).
        self.gc_pacer = GcPacer(held=lambda: self.core.held).start() if pacing_wanted() else None

    def _sla_hooks(self, app: str) -> tuple:
        """With ``autoscaling.policy: sla``: publish this router's class loads each poll
        (cluster/serving/sla_publisher.py)."""
        sla = SlaPublisher(self.core, self.cfg, app, self.router_id, self.generation)
        return (sla.poll,) if sla.active else ()

    async def __del__(self) -> None:
        # Serve awaits this on a graceful stop: a stopped router no longer counts as having applied.
        await self.core.stop_direct_dispatch()
        if self.gc_pacer:
            await self.gc_pacer.stop()
        await self.channel.stop()
        try:
            await asyncio.to_thread(self.tenancy_sync.forget)
        except Exception as exc:  # the GCS going down with the cluster
            log.warning("tenancy report not removed: %s", exc)
        if self.ledger is not None:  # what is queued is written, or spilled for the next router here
            try:
                await self.ledger.close()
            except Exception as exc:
                log.warning("ledger not closed: %s", exc)

    # ---- OpenAI routes ------------------------------------------------------------------------
    @api.post("/v1/completions", responses=api_docs.GENERATE)
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        return await self._serve(request, body, "completion")

    @api.post("/v1/chat/completions", responses=api_docs.GENERATE)
    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        return await self._serve(request, body, "chat")

    @api.get("/v1/models", responses=api_docs.TENANT)
    async def models(self, request: Request) -> Response:
        """The models the caller's key may use, and no other."""
        try:
            tenant = self._tenant(request)
        except Exception as exc:
            return error_response(exc)
        cards = [_card(m) for m in self.core.models_of(tenant)]
        cards += [card(a) for a in self.core.adapters_of(tenant)]
        return JSONResponse({"object": "list", "data": cards})

    @api.get("/v1/models/{model:path}", responses=api_docs.TENANT)
    async def model(self, model: str, request: Request) -> Response:
        try:
            _, adapter = self.core.resolve(self._tenant(request), model)
        except Exception as exc:
            return error_response(exc)
        return JSONResponse(_card(model) if adapter is None else card(adapter))

    # ---- operations ---------------------------------------------------------------------------
    @api.get("/health", responses=api_docs.HEALTH)
    async def health(self) -> Response:
        degraded = self.core.degraded
        replicas = {m.model: m.replicas for m in self.monitor.monitors}
        status, code = health(replicas, self.drain.draining, degraded)
        body = {
            "status": status,
            "router": self.router_id,
            "replicas": self.monitor.replicas,
            "models": replicas,
            # What each model runs with: device, dtype, slots, KV tokens, room.
            "engines": {m.model: engine_figures(m) for m in self.monitor.monitors},
            "quota_store_degraded": degraded,
            "ledger": self.ledger.state if self.ledger is not None else "off",  # ok, behind, spilling
        }
        return JSONResponse(body, status_code=code)

    @api.get("/metrics", responses=api_docs.METRICS)
    async def metrics(self, request: Request) -> Response:
        # The counters name every tenant and its traffic: only operators read them (the admin key,
        # or the metrics key a scraper holds); a tenant key gets 403, no key 401.
        key = parse_bearer(request.headers.get("authorization"))
        try:
            if not self.core.tenancy.auth.may_read_metrics(key):
                self._tenant(request)
                raise Forbidden("the metrics key or the admin key is required", code="metrics_only")
        except Exception as exc:
            return error_response(exc)
        self.core.refresh_queue_metrics()
        self.core.metrics.draining.set(1 if self.drain.draining else 0)
        return Response(self.core.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/tenants/{tenant_id}/sla", responses=api_docs.TENANT)
    async def my_sla(self, tenant_id: str, request: Request) -> Response:
        try:
            tenant = self._tenant(request)
            check_own(tenant, tenant_id, dict(request.query_params))
            return await ledger_views.sla(self.ledger, self.core, dict(request.query_params), tenant.id)
        except Exception as exc:
            return error_response(exc)

    @api.get("/v1/tenants/{tenant_id}/usage", responses=api_docs.TENANT)
    async def my_usage(self, tenant_id: str, request: Request) -> Response:
        try:
            tenant = self._tenant(request)
            check_own(tenant, tenant_id, dict(request.query_params))
            query = dict(request.query_params)
            return await ledger_views.usage_answer(self.ledger, self.core, query, tenant.id)
        except Exception as exc:
            return error_response(exc)

    @api.get("/admin/sla", responses=api_docs.ADMIN)
    async def admin_sla(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            return await ledger_views.sla(self.ledger, self.core, dict(request.query_params), None)
        except Exception as exc:
            return error_response(exc)

    @api.get("/admin/usage", responses=api_docs.ADMIN)
    async def admin_usage(self, request: Request) -> Response:
        """Every tenant's usage buckets (``tenant_id`` narrows it to one)."""
        try:
            self._check_admin(request)
            query = dict(request.query_params)
            return await ledger_views.usage_answer(self.ledger, self.core, query, query.get("tenant_id"))
        except Exception as exc:
            return error_response(exc)

    @api.get("/admin/timings", responses=api_docs.ADMIN)
    async def admin_timings(self, request: Request) -> Response:
        return self._admin(request, lambda: {"records": [r.to_dict() for r in self.core.recorder.records()]})

    @api.post("/admin/timings/reset", responses=api_docs.ADMIN)
    async def admin_timings_reset(self, request: Request) -> Response:
        return self._admin(request, self._reset_timings)

    def _reset_timings(self) -> dict:
        self.core.recorder.clear()
        self.loop_lag.reset()
        self.loop_holds.reset()
        PROCESS_GC.reset()
        if self.gc_pacer:
            self.gc_pacer.reset()
        return {"reset": True}

    @api.get("/admin/state", responses=api_docs.ADMIN)
    async def admin_state(self, request: Request) -> Response:
        return self._admin(request, self._state)

    @api.get("/admin/adapters", responses=api_docs.ADMIN)
    async def admin_adapters(self, request: Request) -> Response:
        return self._admin(request, lambda: listing(self.core.adapters))

    @api.post("/admin/adapters", responses=api_docs.ADMIN)
    async def admin_adapter_add(self, body: AdapterRegistration, request: Request) -> Response:
        try:
            self._check_admin(request)
            return JSONResponse(await self.adapter_admin.register(body), status_code=201)
        except Exception as exc:
            return error_response(exc)

    @api.delete("/admin/adapters/{name:path}", responses=api_docs.ADMIN)
    async def admin_adapter_remove(self, name: str, request: Request) -> Response:
        try:
            self._check_admin(request)
            return JSONResponse(await self.adapter_admin.unregister(name))
        except Exception as exc:
            return error_response(exc)

    @api.post("/admin/tenants/reload", responses=api_docs.RELOAD)
    async def admin_reload(self, request: Request) -> Response:
        # Every router applies the file's version; 202 when some did not report it in time.
        try:
            self._check_admin(request)
            result = await self.tenancy_sync.reload()
        except Exception as exc:
            return error_response(exc)
        return JSONResponse(result.body(), status_code=200 if result.complete else 202)

    # ---- helpers ------------------------------------------------------------------------------
    async def _serve(
        self, request: Request, body: CompletionRequest | ChatCompletionRequest, kind: str
    ) -> Response:
        request_id = new_request_id()
        tenant, key_id, model = None, "", body.model
        received = request.scope.get(RECEIVED_KEY)  # when the HTTP request entered the router
        await asyncio.sleep(0)  # a yield point: the body's parsing and validation were one step
        try:
            tenant = self._tenant(request)  # a bad key is a 401 whatever the ledger's state
            if self.ledger is not None and self.ledger.writer.shedding:  # no room for its row: 503
                return error_response(LedgerFull())
            key_id = api_key_id(
                parse_bearer(request.headers.get("authorization")),
                self.core.tenancy.config.key_salt.get_secret_value(),
            )
            if self.drain.draining:  # counted like any refusal: sent = completed + rejected + ...
                self.core.metrics.observe_rejection(tenant.id, tenant.sla_class, "draining")
                raise Draining(int(self.cfg.drain_timeout_s) or 1)
            pool, adapter = self.core.resolve(tenant, body.model)  # 404 before any quota is taken
            jobs, model = self.jobs[pool.name], pool.name
            batch = await jobs.build_all(request_id, pool.tenant(tenant), body, adapter)  # a job per prompt
            # A yield point: parsing, auth, templating and tokenizing were one step of the loop;
            # admission and dispatch are the next, so no request holds the loop for both.
            await asyncio.sleep(0)
            if self.cfg.log_request_text:  # operators only: text stays out of logs by default
                log.info("request %s tenant %s prompt %r", request_id, tenant.id, body.model_dump())
        except Exception as exc:  # refused before admission: after auth, a ledger row too
            ledger_views.record_refusal(self.ledger, request_id, tenant, key_id, body.model, exc)
            return error_response(exc)
        except asyncio.CancelledError:  # the client left (Serve cancels the handler): its one ending
            if tenant is not None:
                record_client_gone(
                    self.core.recorder, self.core.metrics, request_id, tenant, model, key_id, received
                )
            raise
        try:
            active = await open_all(pool.runner, batch, key_id, received)  # its ending records every refusal
        except Exception as exc:
            return error_response(exc)
        return await answer(kind, request_id, body, active, jobs, self.cfg.log_request_text)

    def _replica_monitor(self, app: str, pool: ModelPool) -> ReplicaMonitor:
        return ReplicaMonitor(
            self.replicas[pool.name],
            pool.dispatcher,
            self.core.metrics,
            self.cfg.load_poll_interval_s,
            lambda: running_counts(app, (pool.deployment, ROUTER_DEPLOYMENT)),
            model=pool.name,
            room_set=pool.model.replica_room,
        )

    async def _read_board(self) -> dict[str, dict]:
        return await asyncio.to_thread(replica_board.fresh_loads, self.generation)

    def _live(self, app: str, model: str) -> frozenset[str] | None:
        return live_replicas(app, self.cfg.deployments[model])

    def _tenant(self, request: Request) -> Tenant:
        key = parse_bearer(request.headers.get("authorization"))
        return self.core.tenancy.auth.authenticate(key)

    def _admin(self, request: Request, action) -> Response:
        try:
            self._check_admin(request)
            return FiniteJSON(action())
        except Exception as exc:
            return error_response(exc)

    def _check_admin(self, request: Request) -> None:
        key = parse_bearer(request.headers.get("authorization"))
        if not self.core.tenancy.auth.is_admin(key):
            self._tenant(request)  # 401 for a bad key, then 403 for a tenant key
            raise Forbidden("admin key required", code="admin_only")

    def _tenancy_sync(self, app: str, generation: str) -> TenancySync:
        return TenancySync.for_router(
            self.cfg,
            Deployment(app, generation, self.router_id),
            lambda tenancy: self.core.apply_tenancy(tenancy),
            lambda: running_replicas(app, ROUTER_DEPLOYMENT) or self.cfg.initial_routers,
        )

    def _state(self) -> dict:
        models = models_state(self.core.pools, self.monitor)
        return totals(models) | {
            "models": models,
            "loads": self.monitor.loads,  # by the monitor's polls, one replica per poll
            "replica_loads": replica_board.fresh_loads(self.generation) if self.generation else {},
            "replica_profiles": self.monitor.profiles,  # each replica's step profile, every 5th poll
            "router": self.router_id,
            "tenancy_version": self.tenancy_sync.version,
            "draining": self.drain.draining,
            "quota_store_degraded": self.core.degraded,
            "rss_bytes": rss_bytes(),
            "loop_lag": self.loop_lag.snapshot(),
            "gc": PROCESS_GC.snapshot(),  # the collector's pauses (all the process's threads wait)
            "gc_pacer": self.gc_pacer.snapshot() if self.gc_pacer else None,
            "loop_thread": threading.current_thread().name,  # Serve's own, or its user-code thread
            "loop_holds": self.loop_holds.snapshot() if self.cfg.loop_holds else None,
            "stream_channel": {"frames": self.channel.frames, "outputs": self.channel.outputs},
            "stream_paths": dict(stream_responses.STREAM_PATHS),  # by module: the class ships by value
            "direct_dispatch": self.core.direct_sent(),
        }
