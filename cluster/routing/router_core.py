"""Everything one router (ingress replica) holds: tenancy objects, one pool per model, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ray.serve.handle import DeploymentHandle

from cluster.config import AppConfig
from cluster.errors import NotFound
from cluster.routing.adapter_registry import Adapter, AdapterRegistry
from cluster.routing.direct_dispatch import DirectDispatch, ReadBoard
from cluster.routing.model_pool import ModelPool, redis_url_with_password
from cluster.routing.stream_receiver import StreamReceiver
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import Authenticator, TenancyConfig, Tenant, default_tenancy_config, load_tenancy_config

log = logging.getLogger(__name__)
LiveSet = frozenset[str] | None

__all__ = ["RouterCore", "TenancyState", "read_tenancy", "redis_url_with_password"]


def read_tenancy(config: AppConfig) -> TenancyConfig:
    """The configured tenancy YAML, or the embedded demo config."""
    if config.tenancy_config is None:
        return default_tenancy_config()
    return load_tenancy_config(config.tenancy_config)


def model_not_found(name: str) -> NotFound:
    """OpenAI's answer for a model that does not exist or that the caller may not use: one body for
    both, so a key cannot tell another tenant's model from a name nobody serves."""
    return NotFound(
        f"The model `{name}` does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


@dataclass
class TenancyState:
    """The parts rebuilt by a config reload; swapped as one object so a request sees one version."""

    config: TenancyConfig
    auth: Authenticator


class RouterCore:
    """One router's state. Single event loop: nothing here needs a lock."""

    def __init__(
        self,
        config: AppConfig,
        replicas: Mapping[str, DeploymentHandle] | DeploymentHandle,
        tenancy: TenancyConfig | None = None,
    ) -> None:
        """``replicas``: each served model's replica handle (one handle alone: the one model's)."""
        self.config = config
        if not isinstance(replicas, Mapping):
            replicas = {config.served_model_name: replicas}
        tenancy = tenancy or read_tenancy(config)
        tenancy.check_models(m.name for m in config.served_models)
        self.tenancy = TenancyState(tenancy, Authenticator(tenancy))
        self.metrics = ClusterMetrics()
        self.recorder = TimingRecorder(config.timing_history)
        self.pools = {
            m.name: ModelPool(m, config, replicas[m.name], tenancy, self.metrics, self.recorder)
            for m in config.served_models
        }
        self.adapters = AdapterRegistry({m.name: m.engine.lora_adapters for m in config.served_models})
        self._counter_sync: asyncio.Task | None = None

    def attach_channel(self, channel: StreamReceiver) -> None:
        """Every pool's outputs from now on come back on ``channel`` (``stream_receiver.py``)."""
        for pool in self.pools.values():
            pool.runner.attach_channel(channel, self.config.stream_flush_s)

    def start_direct_dispatch(self, read_board: ReadBoard, live: Callable[[str], LiveSet]) -> None:
        """With ``direct_dispatch``: each pool finds its replicas on the board (``read_board``) and
        sends to them itself; ``live(model)``: the replica ids Serve still routes that model to."""
        for pool in self.pools.values():
            direct = DirectDispatch(pool.name, self.config.replica_choice)
            pool.runner.direct = direct
            direct.start(read_board, lambda name=pool.name: live(name))

    def direct_sent(self) -> dict[str, int]:
        """Requests each model's pool sent directly (the others went through Serve)."""
        return {p.name: p.runner.direct.sent for p in self.pools.values() if p.runner.direct is not None}

    async def stop_direct_dispatch(self) -> None:
        for pool in self.pools.values():
            if pool.runner.direct is not None:
                await pool.runner.direct.stop()

    def pool_for(self, tenant: Tenant, model: str) -> ModelPool:
        """The pool of ``model`` if ``tenant`` may use it, else the 404 ``model_not_found``."""
        pool = self.pools.get(model)
        if pool is None or not tenant.may_use(model):
            raise model_not_found(model)
        return pool

    def resolve(self, tenant: Tenant, model: str) -> tuple[ModelPool, Adapter | None]:
        """The pool a request's ``model`` runs on, and its LoRA adapter if it names one; the 404
        ``model_not_found`` for a name ``tenant`` may not use (an adapter granted to another tenant
        gets the same answer as a name nobody serves)."""
        adapter = self.adapters.get(model) if model not in self.pools else None
        if adapter is None:
            return self.pool_for(tenant, model), None
        pool = self.pools.get(adapter.model)
        if pool is None or not tenant.may_use_adapter(adapter.name, adapter.model):
            raise model_not_found(model)
        return pool, adapter

    def models_of(self, tenant: Tenant) -> list[str]:
        """The served models ``tenant`` may use, in the config's order."""
        return [name for name in self.pools if tenant.may_use(name)]

    def adapters_of(self, tenant: Tenant) -> list[Adapter]:
        """The adapters ``tenant`` may use, on models it may use."""
        return [
            a
            for a in self.adapters.all()
            if a.model in self.pools and tenant.may_use_adapter(a.name, a.model)
        ]

    def apply_tenancy(self, tenancy: TenancyConfig) -> None:
        """Enforce ``tenancy`` from now on; in-flight requests finish under the limits they were
        admitted with. The fair-share counters carry over (``Dispatcher.replace_queue``), so the
        shared counters keep what they have seen: a reload neither repeats nor forgets service."""
        tenancy.check_models(self.pools)
        for pool in self.pools.values():
            pool.apply_tenancy(tenancy)
        self.tenancy = TenancyState(tenancy, Authenticator(tenancy))

    @property
    def degraded(self) -> bool:
        """Some pool's quota store runs on local limits (Redis unreachable)."""
        return any(p.quotas.degraded for p in self.pools.values())

    @property
    def held(self) -> int:
        """Requests this router still owes an ending, over every model."""
        return sum(p.held for p in self.pools.values())

    async def share_counters(self) -> None:
        """Exchange fair-share service with the other routers (no-op alone)."""
        for pool in self.pools.values():
            await pool.share_counters()

    def start_counter_sync(self, period_s: float) -> None:
        """Share counters every ``period_s`` on a task of its own, not at the monitor's pace (1 s,
        plus the replica polls): the lag between routers is up to two periods, and the simulator
        measured the largest gap between equal tenants with 4 routers at 7.1x one router's with a
        1-s exchange, 3.0x at 0.1 s (docs/tenancy.md)."""
        if self._counter_sync is None and any(p.shared_counters is not None for p in self.pools.values()):
            self._counter_sync = asyncio.get_running_loop().create_task(self._share_every(period_s))

    async def _share_every(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.share_counters()
            except Exception as exc:  # the sync keeps its growth for the next try; the loop goes on
                log.warning("fair-share counter sync failed: %r", exc)

    async def warm_stores(self) -> None:
        for pool in self.pools.values():
            await pool.warm_store()

    async def probe_stores(self) -> None:
        for pool in self.pools.values():
            await pool.probe_store()

    def refresh_queue_metrics(self) -> None:
        for pool in self.pools.values():
            pool.refresh_queue_metrics(self.metrics)
        self.metrics.store_degraded.set(1 if self.degraded else 0)
