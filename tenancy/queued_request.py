"""The items of the fair queue and the per-tenant scheduling policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tenancy.config import TenancyConfig


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request waiting for a replica. ``deadline`` is ``arrival + TTFT target`` of its SLA class."""

    request_id: str
    tenant_id: str
    sla_class: str
    tier: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    deadline: float

    @property
    def size(self) -> int:
        """Tokens the request may occupy on a replica (prompt + max output); compared to capacity."""
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """What the fair queue needs to know about one tenant."""

    weight: float
    tier: int
    sla_class: str
    ttft_target_s: float
    may_preempt: bool


def policies_from_config(config: TenancyConfig) -> dict[str, TenantPolicy]:
    """One ``TenantPolicy`` per configured tenant."""
    policies: dict[str, TenantPolicy] = {}
    for tenant in config.tenants:
        cls = config.classes_by_name[tenant.sla_class]
        policies[tenant.id] = TenantPolicy(
            weight=tenant.weight,
            tier=cls.priority_tier,
            sla_class=cls.name,
            ttft_target_s=cls.ttft_target_s,
            may_preempt=cls.may_preempt_lower_tiers,
        )
    return policies


def tier_names(policies: Mapping[str, TenantPolicy]) -> dict[str, int]:
    """SLA class name -> tier, as used by the policies."""
    return {p.sla_class: p.tier for p in policies.values()}
