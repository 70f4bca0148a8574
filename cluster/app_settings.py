"""The cluster's settings, field by field: defaults, bounds and what each one does. ``AppConfig``
(``cluster/config.py``) adds what is resolved from them: the models' inherited fields, the derived
values, and loading from YAML."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cluster.model_settings import (
    ROOM_NOTE,
    TOOL_CALL_PARSER_NOTE,
    AutoscalingSettings,
    EngineSettings,
    ModelSettings,
    ToolCallParser,
)
from cluster.router_settings import RouterAutoscalingSettings
from tenancy.dispatch_policy import DispatchPolicy

# How clients reach the routers (cluster/ops/edge.py).
Edge = Literal["haproxy", "proxy"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppSettings(_Frozen):
    """``AppConfig``'s fields, in their order (the order of a dump)."""

    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="Replica engine settings (with `models`: what the entries share, field by field).",
    )
    models: tuple[ModelSettings, ...] = Field(
        default=(),
        description=(
            "Several served models, each with its own replica deployment, fair queue and quotas; an "
            "entry takes what it does not give from the top-level engine, num_replicas/autoscaling, "
            "replica_num_cpus, replica_num_gpus and replica_room. Empty: one model, "
            "served_model_name, built from the top-level fields."
        ),
    )
    num_replicas: int = Field(default=1, ge=1, description="Fixed replica count (ignored with autoscaling).")
    autoscaling: AutoscalingSettings | None = Field(
        default=None, description="Autoscale the replicas instead of a fixed count."
    )
    replica_num_cpus: float = Field(default=1.0, ge=0, description="Ray CPUs reserved per replica.")
    replica_num_gpus: float | None = Field(
        default=None, ge=0, description="GPUs per replica; None = 1 when CUDA is present, else 0."
    )
    num_routers: int = Field(
        default=1, ge=1, description="Ingress (router) replicas (ignored with router_autoscaling)."
    )
    router_autoscaling: RouterAutoscalingSettings | None = Field(
        default=None,
        description="Serve autoscaling of the routers on their own load (ongoing requests per router); "
        "None: num_routers. More than one router needs redis_url.",
    )
    tenancy_config: str | None = Field(default=None, description="Tenancy YAML path; None = the demo config.")
    redis_url: str | None = Field(
        default=None, description="Shared quota store; None = in-memory per router."
    )
    redis_prefix: str = Field(default="fairlane", min_length=1, description="Key prefix in Redis.")
    replica_room: int | None = Field(default=None, ge=1, description=ROOM_NOTE)
    tool_call_parser: ToolCallParser = Field(default="auto", description=TOOL_CALL_PARSER_NOTE)
    replica_choice: Literal["load", "prefix"] = Field(
        default="prefix",
        description=(
            "How a router picks the replica for a request (cluster/routing/replica_ranking.py): "
            "prefix weighs the prompt tokens a replica's prefix cache holds against its queued "
            "tokens, so a conversation's later turns go where its history is cached; load ranks by "
            "queued tokens and free KV alone."
        ),
    )
    dispatch_policy: DispatchPolicy = Field(
        default="fairlane",
        description=(
            "The order in which waiting requests get a replica: fairlane (virtual token counters within "
            "SLA tiers; an at-risk request pulls its tier ahead), vtc (counters, one tier) or fcfs "
            "(arrival order, no room reserved). docs/tenancy.md, section 5."
        ),
    )
    queue_timeout_s: float = Field(default=60.0, gt=0, description="Longest wait in the fair queue.")
    first_token_timeout_s: float = Field(default=120.0, gt=0, description="Longest wait for the first token.")
    token_timeout_s: float = Field(default=60.0, gt=0, description="Longest gap between streamed tokens.")
    stream_interval_s: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description=(
            "Streamed outputs travel from the replica in batches at most this often (the first token "
            "and the last always at once). 0 sends every step's token on its own; on a GPU replica with "
            "many streams, 0.05 keeps the per-item cost of the Serve hops below the engine's token rate."
        ),
    )
    stream_items_per_s: float = Field(
        default=1000.0,
        ge=0,
        description=(
            "A router's budget of streamed items per second over all its open streams (0: none). "
            "With N streams open, a new stream's items leave at most every max(stream_interval_s, "
            "N / budget) seconds (1 s at most; on the stream channel min(stream_flush_s, N / budget)), "
            "so the router's per-item CPU stays bounded as replicas and streams are added; each "
            "stream's tokens all arrive, in larger items."
        ),
    )
    stream_channel: bool = Field(
        default=True,
        description=(
            "Streamed outputs travel on a channel per router and replica (one TCP connection from the "
            "replica to a port the router opens on its node): one frame per flush carries every open "
            "stream's new tokens, instead of one Serve stream item per request. stream_interval_s does not "
            "apply; stream_items_per_s and stream_flush_s do. False: one Serve stream per request."
        ),
    )
    stream_flush_s: float = Field(
        default=0.02,
        gt=0,
        le=0.02,
        description=(
            "With stream_channel, the longest a replica holds a stream's outputs before it writes them "
            "to the router (the first and the last output of a request leave at once). The hold follows "
            "the router's item budget: none while stream_items_per_s covers an item per open stream "
            "and engine step (each token leaves as it is made), then open streams / stream_items_per_s, "
            "up to this ceiling."
        ),
    )
    direct_dispatch: bool = Field(
        default=True,
        description=(
            "With stream_channel, a router sends requests straight to the replica it chooses, on one TCP "
            "connection per router and replica (a frame per event-loop tick), instead of a Serve call "
            "per request: Serve's handle machinery leaves the request path. Replicas are found on the "
            "replica board and ranked as replica_choice says. Serve's handle counts do not see these "
            "requests, so with autoscaling the replicas are scaled on their engines' running and "
            "waiting requests instead (cluster/serving/engine_load_policy.py)."
        ),
    )
    handle_grpc: bool = Field(
        default=True,
        description=(
            "Router-to-replica streams over Serve's gRPC channel (handle option _by_reference=False) "
            "instead of Ray actor calls: less CPU per request and per streamed item in both processes."
        ),
    )
    proxy_grpc: bool = Field(
        default=True,
        description=(
            "Serve's HTTP proxy calls the routers over Serve's gRPC channel (RAY_SERVE_PROXY_USE_GRPC=1 in "
            "every Ray process: set by `fairlane serve` when it starts Ray, and by the chart's pod env): "
            "about a sixth less router CPU and a fifth less proxy CPU per request."
        ),
    )
    edge: Edge = Field(
        default="haproxy",
        description=(
            "How clients reach the routers at `port` (cluster/ops/edge.py): haproxy (Serve's HAProxy "
            "ingress: an HAProxy on each node balances over every router's own HTTP port, least "
            "connections first, health-checked, and sends a request whose router refused it or closed "
            "before answering to another router; no Python between client and router) or proxy (Serve's "
            "HTTP proxy, which relays each request and streamed piece through Serve's handles). Both need "
            "their variables in every Ray process before Ray starts: set by `fairlane serve` when it "
            "starts Ray, and by the chart's pod env."
        ),
    )
    direct_ingress: bool = Field(
        default=False,
        description=(
            "With edge: proxy, each router also serves HTTP on a port of its own (its node's first free "
            "port from 30000; RAY_SERVE_ENABLE_DIRECT_INGRESS=1 in every Ray process), so its clients "
            "skip the proxy hop. With edge: haproxy the routers always do (HAProxy sends to those ports). "
            "A stopping router stays up at least 30 s."
        ),
    )
    router_on_serve_loop: bool = Field(
        default=True,
        description=(
            "The routers' own code runs on their Serve replica's event loop "
            "(RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 in the router actors' environment), not on "
            "a second loop in a thread of its own: no hop between threads for each ASGI message and "
            "each streamed piece. Measured on the CPU box: about a quarter less router + proxy CPU per "
            "stream. False: Serve's default thread."
        ),
    )
    loop_holds: bool = Field(
        default=False,
        description=(
            "Time every step of every task on each router's loop and keep the longest, with what ran "
            "(`/admin/state` `loop_holds`; `python -m bench.loop_holds` turns it on). Off by default, "
            "as a measuring tool: it adds a Python-level send and two clock pairs to every task step "
            "(2.4 us on the CPU box); end to end the difference was within that box's noise."
        ),
    )
    serve_access_log: bool = Field(
        default=False,
        description=(
            "Ray Serve's access log line per request in the router and replica (and the proxy of a "
            "local cluster); off: each line costs CPU in the router's hot path."
        ),
    )
    load_poll_interval_s: float = Field(default=1.0, gt=0, description="How often routers poll replica load.")
    counter_sync_s: float = Field(
        default=0.1,
        gt=0,
        description="How often several routers exchange fair-share counters through Redis (one script "
        "call each). The gap between equal tenants grows with it (docs/tenancy.md, several routers).",
    )
    max_body_bytes: int = Field(default=4_000_000, gt=0, description="Largest request body (413 beyond).")
    first_token_retries: int = Field(
        default=2,
        ge=0,
        le=5,
        description="Re-dispatches of a request whose replica failed before its first token.",
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On shutdown: longest wait for in-flight requests to finish."
    )
    replica_graceful_shutdown_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Longest wait of a stopping replica or router (scale-down, rolling update) for its in-flight "
            "requests; Serve routes nothing new to it meanwhile and kills it after. None = long enough "
            "for the longest answer: first_token_timeout_s + the context (engine.max_model_len, the "
            "longest over the models, else 8192 tokens) at 10 tokens/s. A stop ends as soon as its "
            "streams do."
        ),
    )
    redis_fallback_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Share of each quota a router allows alone while Redis is down; None = 1/num_routers.",
    )
    log_request_text: bool = Field(
        default=False, description="Log prompt and completion text (off: text never reaches a log)."
    )
    default_max_tokens: int = Field(
        default=16, gt=0, description="max_tokens of a completion that gives none (OpenAI's default)."
    )
    chat_default_max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Cap on a chat answer that gives no max_tokens; None: the rest of the context, as "
        "OpenAI and vLLM; never above the tenant's max_tokens_per_request or what its context leaves "
        "(quotas and the fair queue count it until the answer ends).",
    )
    max_n: int = Field(default=8, ge=1, le=128, description="Choices one request may ask for (n), at most.")
    timing_history: int = Field(default=50_000, gt=0, description="Request timing records kept per router.")
    ledger: bool = Field(
        default=True,
        description="Write a row per finished request to the ledger (docs/ledger.md); off: SLA and "
        "usage reports come from each router's memory.",
    )
    ledger_dsn: str | None = Field(
        default=None,
        description="PostgreSQL DSN of the ledger (postgresql://...); None: FAIRLANE_LEDGER_DSN, else "
        "the SQLite file ledger_path.",
    )
    ledger_path: str = Field(
        default="~/.cache/fairlane/ledger.sqlite",
        min_length=1,
        description="The ledger's SQLite file when no DSN is set (routers on one machine share it).",
    )
    ledger_spill_dir: str = Field(
        default="~/.cache/fairlane/ledger-spill",
        min_length=1,
        description="Where rows wait as JSON lines while the ledger database is unreachable.",
    )
    ledger_spill_max_rows: int = Field(default=1_000_000, gt=0, description="Spill file bound, in rows.")
    ledger_retention_days: float | None = Field(
        default=400, gt=0, description="Ledger rows older than this are deleted (hourly); None: kept."
    )
    ledger_rollup_retention_days: float | None = Field(
        default=None,
        gt=0,
        description="Hours of the ledger's hourly rollup older than this are deleted; None: as long as "
        "the rows (never shorter: reports read whole hours from the rollup).",
    )
    host: str = Field(default="127.0.0.1", description="HTTP host of the Serve proxy.")
    port: int = Field(default=8000, gt=0, lt=65536, description="HTTP port of the Serve proxy.")
    served_model_name: str = Field(
        default=None,  # type: ignore[assignment]  # resolved by AppConfig: never None after validation
        min_length=1,
        description="Model name in the API of the one-model form; unset: engine.model's own name (the "
        "preset's, or the checkpoint directory's). With `models`, the first entry's name.",
    )
