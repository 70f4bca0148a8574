"""Prometheus metrics of one router, on a registry of its own (so several apps in a process never clash)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from cluster.telemetry.request_timing import RequestTiming

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
TENANT = ("tenant", "sla_class")
MODEL = ("model",)  # the served model: on every series that is one pool's (queue, room, replicas)
REPLICA = ("replica", "model")


class ClusterMetrics:
    """Counters and histograms labelled by tenant and SLA class; each model pool's gauges by model,
    replica gauges by replica id and model."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fairlane_requests", "Requests ended, by outcome.", (*TENANT, "outcome"), registry=r
        )
        self.rejections = Counter(
            "fairlane_rejections", "Requests refused, by reason.", (*TENANT, "reason"), registry=r
        )
        self.prompt_tokens = Counter(
            "fairlane_prompt_tokens", "Prompt tokens of served requests.", TENANT, registry=r
        )
        self.output_tokens = Counter("fairlane_output_tokens", "Output tokens streamed.", TENANT, registry=r)
        # A tenant's prefix-cache hit rate: rate(fairlane_cached_prompt_tokens) / rate(fairlane_prompt_tokens)
        self.cached_prompt_tokens = Counter(
            "fairlane_cached_prompt_tokens",
            "Prompt tokens of served requests found in the replica's prefix cache.",
            TENANT,
            registry=r,
        )
        self.ttft = Histogram(
            "fairlane_ttft_seconds", "Time to first token.", TENANT, buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "fairlane_tpot_seconds",
            "Time per output token after the first.",
            TENANT,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "fairlane_e2e_seconds", "End-to-end latency.", TENANT, buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "fairlane_queue_wait_seconds",
            "Wait in the fair queue.",
            TENANT,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "fairlane_queue_depth", "Requests waiting in the fair queue.", (*TENANT, *MODEL), registry=r
        )
        self.in_flight = Gauge(
            "fairlane_dispatched_in_flight", "Requests dispatched and not ended.", MODEL, registry=r
        )
        self.room = Gauge(
            "fairlane_dispatch_room", "Requests this router may have in flight.", MODEL, registry=r
        )
        self.replicas = Gauge("fairlane_replicas", "Running replicas seen by this router.", MODEL, registry=r)
        self.stream_flush = Gauge(
            "fairlane_stream_flush_seconds",
            "Longest wait of a streamed output on the replica, set by the router's item budget (0: every "
            "engine step's output leaves as it is made).",
            MODEL,
            registry=r,
        )
        self.batch_size = Gauge(
            "fairlane_replica_batch_size", "Running sequences per replica.", REPLICA, registry=r
        )
        self.replica_waiting = Gauge(
            "fairlane_replica_waiting", "Waiting sequences per replica.", REPLICA, registry=r
        )
        self.kv_usage = Gauge("fairlane_replica_kv_usage", "Share of KV blocks in use.", REPLICA, registry=r)
        # Prefix caching per replica, since the replica started (its engine's counts, read with its load).
        self.replica_hit_rate = Gauge(
            "fairlane_replica_prefix_cache_hit_rate",
            "Prompt tokens found in the prefix cache / prompt tokens admitted, since the replica started.",
            REPLICA,
            registry=r,
        )
        self.replica_cached_tokens = Gauge(
            "fairlane_replica_cached_prompt_tokens",
            "Prompt tokens found in the prefix cache since the replica started.",
            REPLICA,
            registry=r,
        )
        self.replica_evictions = Gauge(
            "fairlane_replica_kv_evictions",
            "Cached KV blocks evicted to make room since the replica started.",
            REPLICA,
            registry=r,
        )
        self.replica_blocks_cached = Gauge(
            "fairlane_replica_kv_blocks_cached", "KV blocks in the prefix cache.", REPLICA, registry=r
        )
        self.busy = Gauge(
            "fairlane_replica_device_busy_fraction",
            "Device busy share (engine profiler).",
            REPLICA,
            registry=r,
        )
        self.store_degraded = Gauge(
            "fairlane_quota_store_degraded", "1 while Redis is unreachable.", registry=r
        )
        self.retries = Counter(
            "fairlane_retries",
            "Re-dispatches after a replica failed before the first token.",
            TENANT,
            registry=r,
        )
        self.draining = Gauge("fairlane_draining", "1 while this router drains for shutdown.", registry=r)
        self.http_errors = Counter(
            "fairlane_http_errors",
            "Error answers (status >= 400; 499: the client left first) by route and status.",
            ("route", "status"),
            registry=r,
        )
        # Several routers answer /metrics in turn: the id tells a scraper whose counters it reads.
        self.router_info = Gauge("fairlane_router_info", "This router's id.", ("router",), registry=r)

    def observe_end(self, t: RequestTiming) -> None:
        labels = (t.tenant_id, t.sla_class)
        if t.outcome == "rejected":
            self.observe_rejection(t.tenant_id, t.sla_class, t.reason or "unknown")
            return
        self.requests.labels(*labels, t.outcome or "error").inc()
        self.prompt_tokens.labels(*labels).inc(t.prompt_tokens)
        self.cached_prompt_tokens.labels(*labels).inc(t.cached_tokens)
        for hist, value in (
            (self.ttft, t.ttft),
            (self.tpot, t.tpot),
            (self.e2e, t.e2e),
            (self.queue_wait, t.queue_wait),
        ):
            if value is not None and t.outcome == "ok":
                hist.labels(*labels).observe(value)

    def observe_rejection(self, tenant_id: str, sla_class: str, reason: str) -> None:
        """A request refused before it ran (quota, queue, draining): counted once, with its reason."""
        self.requests.labels(tenant_id, sla_class, "rejected").inc()
        self.rejections.labels(tenant_id, sla_class, reason).inc()

    def token_counter(self, tenant_id: str, sla_class: str) -> Callable[[float], None]:
        """Counts one tenant and class's output tokens, its labels looked up once: a stream counts
        every output it reads, and the lookup cost more than the count."""
        return self.output_tokens.labels(tenant_id, sla_class).inc

    def observe_load(self, load: dict, model: str) -> None:
        labels = (str(load.get("replica_id", "?")), model)
        self.batch_size.labels(*labels).set(load.get("running", 0))
        self.replica_waiting.labels(*labels).set(load.get("waiting", 0))
        total = load.get("kv_blocks_total") or 0
        self.kv_usage.labels(*labels).set(load.get("kv_blocks_used", 0) / total if total else 0.0)
        prompt, cached = load.get("prompt_tokens", 0), load.get("cached_prompt_tokens", 0)
        self.replica_hit_rate.labels(*labels).set(cached / prompt if prompt else 0.0)
        self.replica_cached_tokens.labels(*labels).set(cached)
        self.replica_evictions.labels(*labels).set(load.get("kv_evictions", 0))
        self.replica_blocks_cached.labels(*labels).set(load.get("kv_blocks_cached", 0))

    def observe_profile(self, profile: dict, model: str) -> None:
        busy = profile.get("device_busy_fraction")
        if busy is not None:
            self.busy.labels(str(profile.get("replica_id", "?")), model).set(busy)

    def render(self) -> bytes:
        return generate_latest(self.registry)
