"""The tenancy configuration of a simulated platform: the real ``tenancy.TenancyConfig``.

Quotas are what a rate-limit-only operator would sell: each tenant's weighted share of the
cluster's estimated capacity × ``quota_headroom`` (requests per minute; tokens and concurrency
generous enough that RPM is the binding limit). Keys are placeholders (their hashes only).
"""

from __future__ import annotations

import math

from loadtest.scenario import Scenario
from loadtest.sim.spec import ClusterSpec, ScaleSpec
from loadtest.sim.workload import SimTenant
from tenancy import Quotas, TenancyConfig, Tenant, hash_api_key

MAX_CONTEXT = 1 << 20
SIM_KEY_SALT = "sim-salt-placeholder-keys"  # simulated tenants never authenticate: any valid salt does


def tenancy_config(
    scenario: Scenario,
    tenants: tuple[SimTenant, ...],
    scale: ScaleSpec,
    cluster: ClusterSpec,
    capacity_rps: float,
) -> TenancyConfig:
    total_weight = sum(t.weight for t in tenants)
    return TenancyConfig(
        sla_classes=scenario.classes,
        tenants=tuple(_tenant(t, capacity_rps * t.weight / total_weight, scale, cluster) for t in tenants),
        key_salt=SIM_KEY_SALT,
        admin_key_hash=hash_api_key("sim-admin", SIM_KEY_SALT),
        gpu_dollars_per_hour=cluster.gpu_dollars_per_hour,
    )


def _tenant(t: SimTenant, share_rps: float, scale: ScaleSpec, cluster: ClusterSpec) -> Tenant:
    rpm = max(1, math.ceil(scale.quota_headroom * share_rps * 60))
    quotas = Quotas(
        requests_per_minute=rpm,
        tokens_per_minute=max(rpm * t.max_size, 4 * t.max_size),
        max_concurrent_requests=max(8, math.ceil(scale.quota_headroom * share_rps * cluster.queue_timeout_s)),
        max_tokens_per_request=MAX_CONTEXT // 2,
        max_context_length=MAX_CONTEXT,
    )
    return Tenant(
        id=t.id,
        display_name=t.id,
        api_key_hashes=(hash_api_key(f"sim-key-{t.id}", SIM_KEY_SALT),),
        weight=t.weight,
        sla_class=t.sla_class,
        quotas=quotas,
    )
