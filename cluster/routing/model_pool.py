"""One served model as a router holds it: its quota store, quotas, fair queue, dispatcher and runner.

Each model has its own replica deployment, so each gets its own room (its replicas' count times its
``replica_room``) and its own fair queue: a backlog on one model waits in that model's queue and
takes no slot of another's. Quotas are counted per model too: the pool's store is its own (memory),
or its own key space in Redis (``{redis_prefix}:{model}`` when the app serves several models; the
one-model app keeps ``{redis_prefix}``, the keys it always had), and its limits are each tenant's
limits on this model (``Tenant.model_quotas`` where given, else ``quotas``).
"""

from __future__ import annotations

import os
from urllib.parse import quote

from ray.serve.handle import DeploymentHandle
from redis.asyncio import Redis

from cluster.config import AppConfig
from cluster.model_settings import ModelSettings
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.reconciling_store import ReconcilingStore
from cluster.routing.request_flow import RequestRunner
from cluster.routing.request_job import Timeouts
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import (
    FairQueue,
    MemoryQuotaStore,
    QuotaManager,
    QuotaStore,
    RedisQuotaStore,
    TenancyConfig,
    Tenant,
)
from tenancy.shared_counters import SharedCounters


def redis_url_with_password(url: str) -> str:
    """Add the password from FAIRLANE_REDIS_PASSWORD (the Helm chart's Secret) to a URL without one."""
    password = os.environ.get("FAIRLANE_REDIS_PASSWORD")
    scheme, sep, rest = url.partition("://")
    if not password or not sep or "@" in rest:
        return url
    return f"{scheme}://:{quote(password, safe='')}@{rest}"


def key_prefix(config: AppConfig, model: str) -> str:
    """The Redis key prefix of ``model``'s quotas and shared counters."""
    if len(config.served_models) == 1:
        return config.redis_prefix
    return f"{config.redis_prefix}:{model}"


def make_shared_counters(config: AppConfig, prefix: str) -> SharedCounters | None:
    """With Redis, routers share fair-share counters, so a tenant served by one counts on all."""
    if config.redis_url is None:
        return None
    client = Redis.from_url(
        redis_url_with_password(config.redis_url), socket_timeout=0.1, socket_connect_timeout=0.1
    )
    return SharedCounters(client, prefix=prefix)


def make_store(config: AppConfig, prefix: str) -> QuotaStore:
    if config.redis_url is None:
        return MemoryQuotaStore()
    # from_url: short socket timeouts and no client retries, so no request waits long on a dead Redis.
    redis = RedisQuotaStore.from_url(
        redis_url_with_password(config.redis_url),
        prefix=prefix,
        fallback_fraction=config.fallback_fraction,
    )
    return ReconcilingStore(redis)  # type: ignore[return-value]  # a QuotaStore by delegation


class ModelPool:
    """One model's admission, fair queue and dispatch on this router. Single event loop, no locks."""

    def __init__(
        self,
        model: ModelSettings,
        config: AppConfig,
        replicas: DeploymentHandle,
        tenancy: TenancyConfig,
        metrics: ClusterMetrics,
        recorder: TimingRecorder,
    ) -> None:
        self.model = model
        self.name = model.name
        self.deployment = config.deployments[model.name]
        prefix = key_prefix(config, model.name)
        self.store = make_store(config, prefix)
        self.shared_counters = make_shared_counters(config, prefix)
        self.tenancy = tenancy.for_model(model.name)
        self.quotas = QuotaManager(self.tenancy, self.store)
        self.dispatcher = Dispatcher(
            FairQueue.from_config(self.tenancy, order=config.dispatch_policy),
            model.room_hint,
            config.initial_routers,
            replicas=model.min_replicas,
            queue_timeout_s=config.queue_timeout_s,
        )
        timeouts = Timeouts(config.first_token_timeout_s, config.token_timeout_s, config.first_token_retries)
        self.runner = RequestRunner(
            self.quotas,
            self.dispatcher,
            replicas,
            metrics,
            recorder,
            timeouts,
            grpc=config.handle_grpc,
            stream_items_per_s=config.stream_items_per_s,
            model=model.name,
        )

    def tenant(self, tenant: Tenant) -> Tenant:
        """``tenant`` with its limits on this model (what admission checks a request against)."""
        return self.tenancy.tenant(tenant.id)

    def apply_tenancy(self, tenancy: TenancyConfig) -> None:
        """Enforce ``tenancy`` on this model from now on; the fair-share counters carry over."""
        view = tenancy.for_model(self.name)
        self.quotas = QuotaManager(view, self.store)
        self.dispatcher.replace_queue(FairQueue.from_config(view, order=self.dispatcher.queue.order))
        self.runner.quotas = self.quotas
        self.tenancy = view

    async def share_counters(self) -> None:
        if self.shared_counters is not None:
            await self.shared_counters.sync(self.dispatcher.queue)

    async def warm_store(self) -> None:
        """Before the router serves: reach Redis once and load its scripts, so the first burst of
        requests does not pay for them inside its deadline (unreachable: the store starts degraded)."""
        if hasattr(self.store, "probe"):
            await self.store.probe()

    async def probe_store(self) -> None:
        """Reconnect to Redis from the monitor loop too, so an idle router leaves degraded mode."""
        if self.store.degraded and hasattr(self.store, "probe"):
            await self.store.probe()

    @property
    def held(self) -> int:
        """Requests of this model the router still owes an ending: waiting or in flight."""
        return self.dispatcher.in_flight + len(self.dispatcher.queue)

    def active_leases(self) -> dict[str, int]:
        """Concurrency slots held per tenant on this model (a leak check)."""
        if not hasattr(self.store, "active_leases"):
            return {}
        return {t.id: self.store.active_leases(t.id) for t in self.tenancy.tenants}

    def refresh_queue_metrics(self, metrics: ClusterMetrics) -> None:
        for stats in self.dispatcher.queue.snapshot().tenants.values():
            metrics.queue_depth.labels(stats.tenant_id, stats.sla_class, self.name).set(stats.queued)
        metrics.stream_flush.labels(self.name).set(self.runner.flush_now_s)
