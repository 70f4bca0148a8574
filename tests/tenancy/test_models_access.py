"""Which models a tenant may use, and its limits on each (Tenant.models, Tenant.model_quotas)."""

from __future__ import annotations

import pytest

from tenancy import (
    MemoryQuotaStore,
    ModelQuotas,
    QuotaExceeded,
    QuotaManager,
    TenancyConfig,
    TenancyConfigError,
)
from tenancy import default_tenancy_config as demo


def with_tenant(config: TenancyConfig, tenant_id: str, **fields) -> TenancyConfig:
    data = config.model_dump() | {"key_salt": config.key_salt.get_secret_value()}
    data["tenants"] = [t | fields if t["id"] == tenant_id else t for t in data["tenants"]]
    return TenancyConfig.model_validate(data)


def test_a_tenant_uses_every_model_unless_it_lists_some() -> None:
    config = with_tenant(demo(), "bob", models=["small"])
    assert config.tenant("alice").may_use("anything")
    assert config.tenant("bob").may_use("small") and not config.tenant("bob").may_use("large")
    hash(config.tenant("bob"))  # still a frozen, hashable value


def test_model_quotas_replace_the_fields_they_give_on_that_model_only() -> None:
    config = with_tenant(demo(), "alice", model_quotas=[{"model": "large", "requests_per_minute": 5}])
    base = config.tenant("alice").quotas
    on_large = config.for_model("large").tenant("alice").quotas
    assert on_large == base.model_copy(update={"requests_per_minute": 5})
    assert config.for_model("small") is config and config.tenant("alice").on_model("small").quotas == base
    assert config.for_model("large").tenant("bob") == config.tenant("bob")


@pytest.mark.parametrize(
    ("model_quotas", "message"),
    [
        ([{"model": "a", "max_tokens_per_request": 10_000}], "max_tokens_per_request must not exceed"),
        ([{"model": "a"}, {"model": "a"}], "model_quotas.1.model: duplicate model 'a'"),
        ([{"model": "a", "requests_per_minute": 0}], "greater than 0"),
        ([{"model": "a", "rpm": 5}], "rpm"),
    ],
)
def test_bad_model_quotas_are_refused(model_quotas: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        with_tenant(demo(), "alice", model_quotas=model_quotas)


def test_a_config_naming_a_model_the_app_does_not_serve_is_invalid() -> None:
    config = with_tenant(demo(), "bob", models=["small", "lareg"], model_quotas=[ModelQuotas(model="xl")])
    with pytest.raises(TenancyConfigError) as caught:
        config.check_models(["small", "large"])
    assert caught.value.problems == (
        "tenants.1.models: 'lareg' is not a served model",
        "tenants.1.model_quotas: 'xl' is not a served model",
    )
    with_tenant(demo(), "bob", models=["small"]).check_models(["small", "large"])


async def test_each_models_quotas_count_on_their_own() -> None:
    """Two models' managers, each with its own store (as each model's pool has): a tenant at its
    RPM on one model is admitted on the other, under that model's own limit."""
    config = with_tenant(demo(), "bob", model_quotas=[{"model": "large", "requests_per_minute": 1}])
    now = [1000.0]
    small = QuotaManager(
        config.for_model("small"), MemoryQuotaStore(clock=lambda: now[0]), clock=lambda: now[0]
    )
    large = QuotaManager(
        config.for_model("large"), MemoryQuotaStore(clock=lambda: now[0]), clock=lambda: now[0]
    )
    await large.admit("bob", 10, 10)
    with pytest.raises(QuotaExceeded) as refused:
        await large.admit("bob", 10, 10)
    assert refused.value.reason == "rpm" and refused.value.headers["x-ratelimit-limit-requests"] == "1"
    leases = [await small.admit("bob", 10, 10) for _ in range(5)]  # bob's 600 RPM on small: untouched
    assert leases[0].headers["x-ratelimit-limit-requests"] == "600"
