"""Builders shared by the tenancy tests."""

from __future__ import annotations

from typing import Any

from tenancy import TenancyConfig, hash_api_key

ADMIN_KEY = "sk-test-admin"
SALT = "test-salt-0123456789abcdef"


class FakeClock:
    """A settable clock for decision code."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def quotas(**overrides: Any) -> dict[str, Any]:
    base = {
        "requests_per_minute": 60,
        "tokens_per_minute": 6000,
        "max_concurrent_requests": 4,
        "max_tokens_per_request": 500,
        "max_context_length": 1000,
    }
    return base | overrides


def tenant(tid: str, sla: str = "standard", weight: float = 1.0, **quota_overrides: Any) -> dict[str, Any]:
    return {
        "id": tid,
        "display_name": tid.title(),
        "api_key_hashes": [hash_api_key(f"sk-test-{tid}", SALT)],
        "weight": weight,
        "sla_class": sla,
        "quotas": quotas(**quota_overrides),
    }


def sla_classes() -> list[dict[str, Any]]:
    return [
        {
            "name": "interactive",
            "priority_tier": 0,
            "ttft_target_s": 1.0,
            "tpot_target_s": 0.1,
            "e2e_target_s": 30.0,
            "may_preempt_lower_tiers": True,
        },
        {
            "name": "standard",
            "priority_tier": 1,
            "ttft_target_s": 5.0,
            "tpot_target_s": 0.2,
            "e2e_target_s": 120.0,
            "may_preempt_lower_tiers": True,
        },
        {
            "name": "batch",
            "priority_tier": 2,
            "ttft_target_s": 60.0,
            "tpot_target_s": 1.0,
            "e2e_target_s": 3600.0,
            "may_preempt_lower_tiers": False,
        },
    ]


def config_data(*tenants: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "sla_classes": sla_classes(),
        "tenants": list(tenants),
        "key_salt": SALT,
        "admin_key_hash": hash_api_key(ADMIN_KEY, SALT),
        **extra,
    }


def make_config(*tenants: dict[str, Any], **extra: Any) -> TenancyConfig:
    return TenancyConfig.model_validate(config_data(*tenants, **extra))


# What these tests check of the shared fair-share counters is the exchange (what each router sees of
# the others' service), not the serving bound on one sync: a loaded 2-core box has taken over the
# product's 0.1 s for a Redis round trip. The bound and the fallback past it are tested on their own
# (test_shared_counters.py's outage test, with the default).
SYNC_TIMEOUT_S = 2.0
