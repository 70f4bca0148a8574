"""Everything one router (ingress replica) holds: tenancy objects, dispatcher, runner, metrics."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import quote

from ray.serve.handle import DeploymentHandle
from redis.asyncio import Redis

from cluster.config import AppConfig
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.reconciling_store import ReconcilingStore
from cluster.routing.request_flow import RequestRunner, Timeouts
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import (
    Authenticator,
    FairQueue,
    MemoryQuotaStore,
    QuotaManager,
    QuotaStore,
    RedisQuotaStore,
    TenancyConfig,
    default_tenancy_config,
    load_tenancy_config,
)
from tenancy.shared_counters import SharedCounters


def read_tenancy(config: AppConfig) -> TenancyConfig:
    """The configured tenancy YAML, or the embedded demo config."""
    if config.tenancy_config is None:
        return default_tenancy_config()
    return load_tenancy_config(config.tenancy_config)


def redis_url_with_password(url: str) -> str:
    """Add the password from FAIRLANE_REDIS_PASSWORD (the Helm chart's Secret) to a URL without one."""
    password = os.environ.get("FAIRLANE_REDIS_PASSWORD")
    scheme, sep, rest = url.partition("://")
    if not password or not sep or "@" in rest:
        return url
    return f"{scheme}://:{quote(password, safe='')}@{rest}"


def make_shared_counters(config: AppConfig) -> SharedCounters | None:
    """With Redis, routers share fair-share counters, so a tenant served by one counts on all."""
    if config.redis_url is None:
        return None
    client = Redis.from_url(
        redis_url_with_password(config.redis_url), socket_timeout=0.1, socket_connect_timeout=0.1
    )
    return SharedCounters(client, prefix=config.redis_prefix)


def make_store(config: AppConfig) -> QuotaStore:
    if config.redis_url is None:
        return MemoryQuotaStore()
    # from_url: short socket timeouts and no client retries, so no request waits long on a dead Redis.
    redis = RedisQuotaStore.from_url(
        redis_url_with_password(config.redis_url),
        prefix=config.redis_prefix,
        fallback_fraction=config.fallback_fraction,
    )
    return ReconcilingStore(redis)  # type: ignore[return-value]  # a QuotaStore by delegation


@dataclass
class TenancyState:
    """The parts rebuilt by a config reload; swapped as one object so a request sees one version."""

    config: TenancyConfig
    auth: Authenticator
    quotas: QuotaManager


class RouterCore:
    """One router's state. Single event loop: nothing here needs a lock."""

    def __init__(
        self, config: AppConfig, replicas: DeploymentHandle, tenancy: TenancyConfig | None = None
    ) -> None:
        self.config = config
        self.store = make_store(config)
        self.shared_counters = make_shared_counters(config)
        self.tenancy = self._tenancy_state(tenancy or read_tenancy(config))
        self.metrics = ClusterMetrics()
        self.recorder = TimingRecorder(config.timing_history)
        queue = FairQueue.from_config(self.tenancy.config)
        self.dispatcher = Dispatcher(
            queue,
            config.replica_room,
            config.num_routers,
            replicas=config.min_replicas,
            queue_timeout_s=config.queue_timeout_s,
        )
        timeouts = Timeouts(config.first_token_timeout_s, config.token_timeout_s, config.first_token_retries)
        self.runner = RequestRunner(
            self.tenancy.quotas,
            self.dispatcher,
            replicas,
            self.metrics,
            self.recorder,
            timeouts,
            grpc=config.handle_grpc,
            stream_items_per_s=config.stream_items_per_s,
        )

    def _tenancy_state(self, tenancy: TenancyConfig) -> TenancyState:
        return TenancyState(tenancy, Authenticator(tenancy), QuotaManager(tenancy, self.store))

    def apply_tenancy(self, tenancy: TenancyConfig) -> None:
        """Enforce ``tenancy`` from now on; in-flight requests finish under the limits they were
        admitted with. The fair-share counters carry over (``Dispatcher.replace_queue``), so the
        shared counters keep what they have seen: a reload neither repeats nor forgets service."""
        state = self._tenancy_state(tenancy)
        self.dispatcher.replace_queue(FairQueue.from_config(tenancy))
        self.tenancy = state
        self.runner.quotas = state.quotas

    async def share_counters(self) -> None:
        """Exchange fair-share service with the other routers (a monitor-loop duty; no-op alone)."""
        if self.shared_counters is not None:
            await self.shared_counters.sync(self.dispatcher.queue)

    def refresh_queue_metrics(self) -> None:
        snap = self.dispatcher.queue.snapshot()
        for stats in snap.tenants.values():
            self.metrics.queue_depth.labels(stats.tenant_id, stats.sla_class).set(stats.queued)
        self.metrics.store_degraded.set(1 if self.tenancy.quotas.degraded else 0)
