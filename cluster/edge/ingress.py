"""The HTTP ingress: OpenAI routes, health, metrics, SLA reports and admin, under ``serve.ingress``."""

import asyncio
import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from cluster.config import AppConfig
from cluster.drain import RouterDrain
from cluster.edge import api_docs
from cluster.edge.body_limit import BodyLimit
from cluster.edge.job_builder import JobBuilder
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.edge.responses import (
    ChoiceState,
    ClosingStreamingResponse,
    ResponseMeta,
    full_body,
    guarded,
    sse_stream,
)
from cluster.edge.tenant_views import check_own, sla_report, usage
from cluster.errors import Draining, Forbidden, error_response
from cluster.routing.replica_monitor import ReplicaMonitor, running_replicas
from cluster.routing.request_flow import ActiveRequest
from cluster.routing.router_core import RouterCore
from cluster.routing.tenancy_sync import Deployment, TenancySync
from cluster.serving import replica_board
from cluster.telemetry.process_memory import rss_bytes
from cluster.telemetry.status_metrics import StatusMetrics
from cluster.text.prompts import PromptEncoder
from tenancy import Tenant, parse_bearer

REPLICA_DEPLOYMENT = "Replica"
ROUTER_DEPLOYMENT = "Router"
log = logging.getLogger(__name__)
api = FastAPI(title="fairlane", docs_url=None, redoc_url=None)
# The router sets the limit when it starts; until then (and outside Serve) no limit applies.
api.add_middleware(BodyLimit, limit=lambda: getattr(api.state, "max_body_bytes", None))
# Outermost, so it also counts the 413s of the body limit.
api.add_middleware(StatusMetrics, counter=lambda: getattr(api.state, "http_errors", None))


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(exc)


@api.exception_handler(HTTPException)
async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return error_response(exc)


# Above the class: serve.ingress serializes the routes (and the globals they use) as it decorates.
@serve.ingress(api)
class Ingress:
    """One router: authenticates, admits, queues fairly, dispatches and streams."""

    async def __init__(
        self, replicas: DeploymentHandle, config: dict[str, Any], generation: str = ""
    ) -> None:
        """``generation``: the id of this deployment of the app (``cluster.app.compose``)."""
        self.cfg = AppConfig.model_validate(config)
        api.state.max_body_bytes = self.cfg.max_body_bytes
        self.replicas = replicas
        self.generation = generation
        ctx = serve.get_replica_context()
        self.router_id = ctx.replica_id.unique_id
        self.tenancy_sync = self._tenancy_sync(ctx.app_name, generation)
        self.core = RouterCore(self.cfg, replicas, (await self.tenancy_sync.initial()).config)
        api.state.http_errors = self.core.metrics.http_errors
        encoder = PromptEncoder.for_model(
            self.cfg.engine.model, self.cfg.engine.random_weights, self.cfg.engine.synthetic_tokenizer
        )
        self.jobs = JobBuilder(self.cfg, encoder, self._max_model_len)
        self.core.metrics.router_info.labels(self.router_id).set(1)
        self.drain = RouterDrain(ctx.app_name, self.router_id, self._held)
        self.monitor = ReplicaMonitor(
            replicas,
            self.core.dispatcher,
            self.core.metrics,
            self.core.recorder,
            self.cfg.load_poll_interval_s,
            lambda: running_replicas(ctx.app_name, REPLICA_DEPLOYMENT),
            hooks=(self.drain.poll, self._probe_store, self.core.share_counters, self.tenancy_sync.poll),
        )
        self.monitor.start()

    async def __del__(self) -> None:
        # Serve awaits this on a graceful stop: a stopped router no longer counts as having applied.
        try:
            await asyncio.to_thread(self.tenancy_sync.forget)
        except Exception as exc:  # the GCS going down with the cluster
            log.warning("tenancy report not removed: %s", exc)

    # ---- OpenAI routes ------------------------------------------------------------------------
    @api.post("/v1/completions", responses=api_docs.GENERATE)
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        return await self._serve(request, body, "completion")

    @api.post("/v1/chat/completions", responses=api_docs.GENERATE)
    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        return await self._serve(request, body, "chat")

    @api.get("/v1/models", responses=api_docs.TENANT)
    async def models(self, request: Request) -> Response:
        try:
            self._tenant(request)
        except Exception as exc:
            return error_response(exc)
        card = {"id": self.cfg.served_model_name, "object": "model", "created": 0, "owned_by": "fairlane"}
        return JSONResponse({"object": "list", "data": [card]})

    # ---- operations ---------------------------------------------------------------------------
    @api.get("/health", responses=api_docs.HEALTH)
    async def health(self) -> Response:
        degraded = self.core.tenancy.quotas.degraded
        if self.drain.draining:
            status = "draining"
        elif self.monitor.replicas <= 0:
            status = "no_replicas"
        else:
            status = "degraded" if degraded else "ok"  # degraded: serving on local quota limits
        body = {
            "status": status,
            "router": self.router_id,
            "replicas": self.monitor.replicas,
            "quota_store_degraded": degraded,
        }
        return JSONResponse(body, status_code=200 if status in ("ok", "degraded") else 503)

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
        except Exception as exc:
            return error_response(exc)
        return JSONResponse(sla_report(self.core.recorder, self.core.tenancy.config, tenant.id))

    @api.get("/v1/tenants/{tenant_id}/usage", responses=api_docs.TENANT)
    async def my_usage(self, tenant_id: str, request: Request) -> Response:
        try:
            tenant = self._tenant(request)
            check_own(tenant, tenant_id, dict(request.query_params))
        except Exception as exc:
            return error_response(exc)
        return JSONResponse(usage(self.core.recorder.records(), tenant.id))

    @api.get("/admin/sla", responses=api_docs.ADMIN)
    async def admin_sla(self, request: Request) -> Response:
        return self._admin(request, lambda: sla_report(self.core.recorder, self.core.tenancy.config, None))

    @api.get("/admin/timings", responses=api_docs.ADMIN)
    async def admin_timings(self, request: Request) -> Response:
        return self._admin(request, lambda: {"records": [r.to_dict() for r in self.core.recorder.records()]})

    @api.post("/admin/timings/reset", responses=api_docs.ADMIN)
    async def admin_timings_reset(self, request: Request) -> Response:
        return self._admin(request, lambda: self.core.recorder.clear() or {"reset": True})

    @api.get("/admin/state", responses=api_docs.ADMIN)
    async def admin_state(self, request: Request) -> Response:
        return self._admin(request, self._state)

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
        request_id = uuid.uuid4().hex
        try:
            tenant = self._tenant(request)
            if self.drain.draining:  # counted like any refusal: sent = completed + rejected + ...
                self.core.metrics.observe_rejection(tenant.id, tenant.sla_class, "draining")
                raise Draining(int(self.cfg.drain_timeout_s) or 1)
            job = await self.jobs.build(request_id, tenant, body)
            if self.cfg.log_request_text:  # operators only: text stays out of logs by default
                log.info("request %s tenant %s prompt %r", request_id, tenant.id, body.model_dump())
            active = await self.core.runner.open(job)
        except Exception as exc:
            return error_response(exc)
        meta = self._response_meta(kind, request_id, body, active.job.prompt_ids)
        headers = dict(active.lease.headers) if active.lease else {}
        token_text = self.jobs.encoder.token_text
        if body.stream:
            outputs = active.outputs()
            stream = guarded(sse_stream(meta, outputs, body.include_usage, token_text, body.n))
            return ClosingStreamingResponse(
                stream,
                lambda: active.close("aborted", "client_gone"),  # no-op after a normal end
                media_type="text/event-stream",
                headers=headers,
            )
        return await self._collect(meta, active, headers, body.n)

    def _response_meta(self, kind: str, request_id: str, body, prompt_ids: list[int]) -> ResponseMeta:
        logprobs = body.logprob_count() if kind == "chat" else body.logprobs
        echo = None
        if kind == "completion" and body.echo:
            prompt = body.single_prompt()
            text = prompt if isinstance(prompt, str) else self.jobs.encoder.decode(prompt)
            echo = (text, tuple(prompt_ids))
        model = self.cfg.served_model_name
        return ResponseMeta.new(kind, request_id, model, logprobs=logprobs, echo=echo)  # type: ignore[arg-type]

    async def _collect(
        self, meta: ResponseMeta, active: ActiveRequest, headers: dict[str, str], n: int
    ) -> Response:
        choices = [ChoiceState(i, meta, self.jobs.encoder.token_text) for i in range(n)]
        last: dict[str, Any] = {}
        try:
            async for item in active.outputs():
                choices[item["index"]].add(item)
                last = item
        except Exception as exc:
            return error_response(exc)
        if self.cfg.log_request_text:
            log.info("request %s completion %r", meta.response_id, ["".join(c.text) for c in choices])
        prompt_tokens, output_tokens = last.get("num_prompt_tokens", 0), last.get("total_output_tokens", 0)
        return JSONResponse(full_body(meta, choices, prompt_tokens, output_tokens), headers=headers)

    async def _max_model_len(self) -> int:
        info = await self.replicas.info.remote()
        return int(info["max_model_len"])

    def _held(self) -> int:
        """Requests this router still owes an ending: waiting in the fair queue or in flight."""
        return self.core.dispatcher.in_flight + len(self.core.dispatcher.queue)

    async def _probe_store(self) -> None:
        """Reconnect to Redis from the monitor loop too, so an idle router leaves degraded mode."""
        store = self.core.tenancy.quotas.store
        if store.degraded and hasattr(store, "probe"):
            await store.probe()

    def _tenant(self, request: Request) -> Tenant:
        key = parse_bearer(request.headers.get("authorization"))
        return self.core.tenancy.auth.authenticate(key)

    def _admin(self, request: Request, action) -> Response:
        try:
            self._check_admin(request)
            return JSONResponse(action())
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
            lambda: running_replicas(app, ROUTER_DEPLOYMENT) or self.cfg.num_routers,
        )

    def _state(self) -> dict:
        d = self.core.dispatcher
        store = self.core.store
        leases = {}
        if hasattr(store, "active_leases"):
            leases = {t.id: store.active_leases(t.id) for t in self.core.tenancy.config.tenants}
        return {
            "in_flight": d.in_flight,
            "capacity": d.capacity,
            "queued": len(d.queue),
            "replicas": self.monitor.replicas,
            "active_leases": leases,
            "loads": self.monitor.loads,  # by the monitor's polls, one replica per poll
            "replica_loads": replica_board.fresh_loads(self.generation) if self.generation else {},
            "router": self.router_id,
            "tenancy_version": self.tenancy_sync.version,
            "draining": self.drain.draining,
            "quota_store_degraded": self.core.tenancy.quotas.degraded,
            "waiters": self.core.dispatcher.waiters,
            "tracked_ids": self.core.dispatcher.tracked_ids,
            "rss_bytes": rss_bytes(),
        }
