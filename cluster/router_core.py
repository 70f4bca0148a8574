"""Everything one router (ingress replica) holds: tenancy objects, dispatcher, runner, metrics."""

from __future__ import annotations

from dataclasses import dataclass

from ray.serve.handle import DeploymentHandle

from cluster.config import AppConfig
from cluster.dispatcher import Dispatcher
from cluster.metrics import ClusterMetrics
from cluster.reconciling_store import ReconcilingStore
from cluster.request_flow import RequestRunner, Timeouts
from cluster.request_timing import TimingRecorder
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


def read_tenancy(config: AppConfig) -> TenancyConfig:
    """The configured tenancy YAML, or the embedded demo config."""
    if config.tenancy_config is None:
        return default_tenancy_config()
    return load_tenancy_config(config.tenancy_config)


def make_store(config: AppConfig) -> QuotaStore:
    if config.redis_url is None:
        return MemoryQuotaStore()
    # from_url: short socket timeouts and no client retries, so no request waits long on a dead Redis.
    redis = RedisQuotaStore.from_url(
        config.redis_url, prefix=config.redis_prefix, fallback_fraction=config.fallback_fraction
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

    def __init__(self, config: AppConfig, replicas: DeploymentHandle) -> None:
        self.config = config
        self.store = make_store(config)
        self.tenancy = self._tenancy_state(read_tenancy(config))
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
            self.tenancy.quotas, self.dispatcher, replicas, self.metrics, self.recorder, timeouts
        )

    def _tenancy_state(self, tenancy: TenancyConfig) -> TenancyState:
        return TenancyState(tenancy, Authenticator(tenancy), QuotaManager(tenancy, self.store))

    def reload_tenancy(self) -> TenancyConfig:
        """Re-read the tenancy config; in-flight requests finish under the limits they were admitted with."""
        state = self._tenancy_state(read_tenancy(self.config))
        self.dispatcher.replace_queue(FairQueue.from_config(state.config))
        self.tenancy = state
        self.runner.quotas = state.quotas
        return state.config

    def refresh_queue_metrics(self) -> None:
        snap = self.dispatcher.queue.snapshot()
        for stats in snap.tenants.values():
            self.metrics.queue_depth.labels(stats.tenant_id, stats.sla_class).set(stats.queued)
        self.metrics.store_degraded.set(1 if self.tenancy.quotas.degraded else 0)
