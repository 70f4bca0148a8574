"""The HTTP ingress: OpenAI routes, health, metrics, SLA reports and admin, under ``serve.ingress``."""

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from cluster.config import AppConfig
from cluster.errors import (
    BadRequest,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    error_response,
)
from cluster.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.prompts import PromptEncoder
from cluster.replica_monitor import ReplicaMonitor, running_replicas
from cluster.request_flow import ActiveRequest, Job
from cluster.responses import ResponseMeta, full_body, guarded, sse_stream
from cluster.router_core import RouterCore
from cluster.sla_report import build_report
from replica import SamplingParams
from tenancy import Tenant, parse_bearer

REPLICA_DEPLOYMENT = "Replica"
NON_STREAM_COALESCE_S = 0.05  # outputs of a non-streamed request travel in 50 ms batches
api = FastAPI(title="fairlane", docs_url=None, redoc_url=None)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(exc)


@api.exception_handler(HTTPException)
async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return error_response(exc)


@api.middleware("http")
async def _body_limit(request: Request, call_next):
    # Content-Length is checked before the body is read; Serve's proxy buffers chunked bodies anyway.
    limit = request.app.state.max_body_bytes if hasattr(request.app.state, "max_body_bytes") else None
    length = request.headers.get("content-length")
    if limit is not None and length is not None and length.isdigit() and int(length) > limit:
        return error_response(PayloadTooLarge(f"request body over {limit} bytes", code="body_too_large"))
    return await call_next(request)


@serve.ingress(api)
class Ingress:
    """One router: authenticates, admits, queues fairly, dispatches and streams."""

    async def __init__(self, replicas: DeploymentHandle, config: dict[str, Any]) -> None:
        self.cfg = AppConfig.model_validate(config)
        api.state.max_body_bytes = self.cfg.max_body_bytes
        self.replicas = replicas
        self.core = RouterCore(self.cfg, replicas)
        self.encoder = PromptEncoder.for_model(self.cfg.engine.model, self.cfg.engine.random_weights)
        app_name = serve.get_replica_context().app_name
        self.monitor = ReplicaMonitor(
            replicas,
            self.core.dispatcher,
            self.core.metrics,
            self.core.recorder,
            self.cfg.load_poll_interval_s,
            lambda: running_replicas(app_name, REPLICA_DEPLOYMENT),
        )
        self.monitor.start()
        self._max_model_len: int | None = None

    # ---- OpenAI routes ------------------------------------------------------------------------
    @api.post("/v1/completions")
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        return await self._serve(request, body, "completion")

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        return await self._serve(request, body, "chat")

    @api.get("/v1/models")
    async def models(self, request: Request) -> Response:
        try:
            self._tenant(request)
        except Exception as exc:
            return error_response(exc)
        card = {"id": self.cfg.served_model_name, "object": "model", "created": 0, "owned_by": "fairlane"}
        return JSONResponse({"object": "list", "data": [card]})

    # ---- operations ---------------------------------------------------------------------------
    @api.get("/health")
    async def health(self) -> Response:
        ok = self.monitor.replicas > 0
        body = {
            "status": "ok" if ok else "no_replicas",
            "replicas": self.monitor.replicas,
            "quota_store_degraded": self.core.tenancy.quotas.degraded,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @api.get("/metrics")
    async def metrics(self) -> Response:
        self.core.refresh_queue_metrics()
        return Response(self.core.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/tenants/me/sla")
    async def my_sla(self, request: Request) -> Response:
        try:
            tenant = self._tenant(request)
        except Exception as exc:
            return error_response(exc)
        return JSONResponse(self._report(tenant.id))

    @api.get("/admin/sla")
    async def admin_sla(self, request: Request) -> Response:
        return self._admin(request, lambda: self._report(None))

    @api.get("/admin/timings")
    async def admin_timings(self, request: Request) -> Response:
        return self._admin(request, lambda: {"records": [r.to_dict() for r in self.core.recorder.records()]})

    @api.post("/admin/timings/reset")
    async def admin_timings_reset(self, request: Request) -> Response:
        return self._admin(request, lambda: self.core.recorder.clear() or {"reset": True})

    @api.get("/admin/state")
    async def admin_state(self, request: Request) -> Response:
        return self._admin(request, self._state)

    @api.post("/admin/tenants/reload")
    async def admin_reload(self, request: Request) -> Response:
        return self._admin(request, lambda: {"tenants": [t.id for t in self.core.reload_tenancy().tenants]})

    # ---- helpers ------------------------------------------------------------------------------
    async def _serve(
        self, request: Request, body: CompletionRequest | ChatCompletionRequest, kind: str
    ) -> Response:
        request_id = uuid.uuid4().hex
        try:
            tenant = self._tenant(request)
            job = await self._job(request_id, tenant, body)
            active = await self.core.runner.open(job)
        except Exception as exc:
            return error_response(exc)
        meta = ResponseMeta.new(kind, request_id, self.cfg.served_model_name)  # type: ignore[arg-type]
        headers = dict(active.lease.headers) if active.lease else {}
        if body.stream:
            stream = guarded(sse_stream(meta, active.outputs(), body.include_usage))
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        return await self._collect(meta, active, headers)

    async def _collect(self, meta: ResponseMeta, active: ActiveRequest, headers: dict[str, str]) -> Response:
        text: list[str] = []
        last: dict[str, Any] = {}
        try:
            async for item in active.outputs():
                text.append(item["text"])
                last = item
        except Exception as exc:
            return error_response(exc)
        body = full_body(
            meta,
            "".join(text),
            last.get("finish_reason"),
            last.get("num_prompt_tokens", 0),
            last.get("num_output_tokens", 0),
        )
        return JSONResponse(body, headers=headers)

    async def _job(
        self, request_id: str, tenant: Tenant, body: CompletionRequest | ChatCompletionRequest
    ) -> Job:
        if body.model != self.cfg.served_model_name:
            raise NotFound(f"the model {body.model!r} does not exist", code="model_not_found", param="model")
        if isinstance(body, ChatCompletionRequest):
            ids = self.encoder.chat(body.template_messages())
            max_tokens = body.output_limit()
        else:
            try:
                prompt = body.single_prompt()
            except ValueError as exc:
                raise BadRequest(str(exc), param="prompt") from None
            ids = self.encoder.completion(prompt)
            max_tokens = body.max_tokens
        max_tokens = max_tokens or self.cfg.default_max_tokens
        await self._check_context(len(ids), max_tokens)
        sampling = {
            "max_tokens": max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "seed": body.seed,
            "stop": body.stop_tuple(),
        }
        SamplingParams(**sampling)  # validate here: a bad value is a 400 before any quota is taken
        coalesce = 0.0 if body.stream else NON_STREAM_COALESCE_S
        return Job(request_id, tenant, tenant.sla_class, ids, sampling, coalesce)

    async def _check_context(self, prompt_tokens: int, max_tokens: int) -> None:
        if self._max_model_len is None:
            info = await self.replicas.info.remote()
            self._max_model_len = int(info["max_model_len"])
        limit = self._max_model_len
        if prompt_tokens + max_tokens > limit:
            raise BadRequest(
                f"this model's maximum context length is {limit} tokens; the request asks for "
                f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to generate)",
                code="context_length_exceeded",
                param="prompt",
            )

    def _tenant(self, request: Request) -> Tenant:
        key = parse_bearer(request.headers.get("authorization"))
        return self.core.tenancy.auth.authenticate(key)

    def _admin(self, request: Request, action) -> Response:
        key = parse_bearer(request.headers.get("authorization"))
        try:
            if not self.core.tenancy.auth.is_admin(key):
                self._tenant(request)  # 401 for a bad key, then 403 for a tenant key
                raise Forbidden("admin key required", code="admin_only")
            return JSONResponse(action())
        except Exception as exc:
            return error_response(exc)

    def _report(self, tenant_id: str | None) -> dict:
        rec = self.core.recorder
        records = [r for r in rec.records() if tenant_id is None or r.tenant_id == tenant_id]
        window = time.monotonic() - rec.started
        return build_report(records, self.core.tenancy.config, window, rec.replica_seconds).to_dict()

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
            "loads": self.monitor.loads,
        }
