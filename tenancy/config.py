"""Tenant and SLA-class configuration: pydantic models validated once at start, then immutable."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tenancy.errors import TenancyConfigError, UnknownTenantError
from tenancy.keys import KEY_HASH_PATTERN, LEGACY_PREFIX, MIN_SALT_LENGTH, check_salt, is_key_hash

TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_REHASH = "re-hash each key with `fairlane hash-key --config <tenancy.yaml>` (prints 'hmac-sha256:<hex>')"


def _check_key_hash(value: str) -> str:
    # Checked here rather than with a plain pattern so an old unsalted hash gets a message that says
    # what changed and how to migrate, not just "should match pattern".
    if value.startswith(LEGACY_PREFIX):
        raise ValueError(f"plain 'sha256:' key hashes are no longer accepted (unsalted); {_REHASH}")
    if not is_key_hash(value):
        raise ValueError(f"expected 'hmac-sha256:<64 hex digits>' (never a plaintext key); {_REHASH}")
    return value


KeyHash = Annotated[
    str,
    AfterValidator(_check_key_hash),
    Field(
        description="HMAC-SHA256 of an API key under key_salt, 'hmac-sha256:<hex>'.",
        json_schema_extra={"pattern": KEY_HASH_PATTERN},
    ),
]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quotas(_Frozen):
    """Rate, concurrency and size limits of one tenant."""

    requests_per_minute: int = Field(gt=0, description="Token-bucket size and per-minute refill of requests.")
    tokens_per_minute: int = Field(
        gt=0, description="Token-bucket size and per-minute refill of tokens (prompt + output)."
    )
    max_concurrent_requests: int = Field(gt=0, description="Requests admitted and not yet ended, at most.")
    max_tokens_per_request: int = Field(gt=0, description="Largest max_tokens (output) of one request.")
    max_context_length: int = Field(gt=0, description="Largest prompt + max_tokens of one request.")
    daily_token_budget: int | None = Field(
        default=None, gt=0, description="Tokens (prompt + output) per UTC day; None for no budget."
    )

    @model_validator(mode="after")
    def _output_fits_context(self) -> Quotas:
        if self.max_tokens_per_request > self.max_context_length:
            raise ValueError("max_tokens_per_request must not exceed max_context_length")
        return self


class ModelQuotas(_Frozen):
    """A tenant's limits on one model where they differ from its ``quotas``; unset fields keep those."""

    model: str = Field(
        min_length=1, description="The served model (a request's `model`) these limits are for."
    )
    requests_per_minute: int | None = Field(
        default=None, gt=0, description="Requests per minute on the model."
    )
    tokens_per_minute: int | None = Field(default=None, gt=0, description="Tokens per minute on the model.")
    max_concurrent_requests: int | None = Field(
        default=None, gt=0, description="Requests in flight on the model, at most."
    )
    max_tokens_per_request: int | None = Field(
        default=None, gt=0, description="Largest max_tokens on the model."
    )
    max_context_length: int | None = Field(
        default=None, gt=0, description="Largest prompt + max_tokens on the model."
    )
    daily_token_budget: int | None = Field(default=None, gt=0, description="Tokens per UTC day on the model.")

    def apply_to(self, quotas: Quotas) -> Quotas:
        given = self.model_dump(exclude_none=True, exclude={"model"})
        return Quotas.model_validate(quotas.model_dump() | given)


class Tenant(_Frozen):
    """One tenant: identity, API keys (hashed), fair-share weight, SLA class, quotas and models."""

    id: str = Field(pattern=TENANT_ID_PATTERN, description="Stable tenant id (letters, digits, _ . -).")
    display_name: str = Field(min_length=1, max_length=200, description="Human-readable name.")
    api_key_hashes: tuple[KeyHash, ...] = Field(
        min_length=1, description="HMACs of the tenant's API keys ('hmac-sha256:<hex>'), never plaintext."
    )
    weight: float = Field(gt=0, le=1e6, description="Fair-share weight: relative share of service when busy.")
    sla_class: str = Field(min_length=1, description="Name of the tenant's SLA class.")
    quotas: Quotas = Field(description="Rate, concurrency and size limits.")
    cost_per_million_tokens: float | None = Field(
        default=None, ge=0, description="Price billed per million tokens (USD), if the tenant is billed."
    )
    cache_group: str | None = Field(
        default=None,
        pattern=TENANT_ID_PATTERN,
        description="Tenants of one cache group share cached prompt blocks (the operator declares a "
        "shared prefix); None = the tenant's cache is its own.",
    )
    models: tuple[str, ...] | None = Field(
        default=None,
        description="Served models (the requests' `model`) this tenant may use; None = every model.",
    )
    adapters: tuple[str, ...] = Field(
        default=(),
        description="LoRA adapters (served under their own names, on their base model) this tenant may "
        "use; none by default: an adapter is a tenant's own fine-tune, and another tenant's is a 404.",
    )
    model_quotas: tuple[ModelQuotas, ...] = Field(
        default=(),
        description="Per model, the limits that differ from `quotas` there. Quotas are counted per "
        "model either way: a tenant's use of one model takes nothing from its limits on another.",
    )

    @model_validator(mode="after")
    def _model_quotas_valid(self) -> Tenant:
        seen: set[str] = set()
        for i, entry in enumerate(self.model_quotas):
            if entry.model in seen:
                raise ValueError(f"model_quotas.{i}.model: duplicate model {entry.model!r}")
            seen.add(entry.model)
            try:
                entry.apply_to(self.quotas)
            except ValueError as exc:
                raise ValueError(f"model_quotas.{i}: {exc}") from None
        return self

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_use_adapter(self, adapter: str, base_model: str) -> bool:
        """The adapter is granted to this tenant, and so is the model it runs on."""
        return adapter in self.adapters and self.may_use(base_model)

    def on_model(self, model: str) -> Tenant:
        """This tenant with the quotas it has on ``model``."""
        for entry in self.model_quotas:
            if entry.model == model:
                return self.model_copy(update={"quotas": entry.apply_to(self.quotas)})
        return self


class SLAClass(_Frozen):
    """A service class: its urgency tier and latency targets."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="Class name referenced by tenants.")
    priority_tier: int = Field(ge=0, le=100, description="Urgency: 0 is the most urgent; larger is laxer.")
    ttft_target_s: float = Field(gt=0, description="Time-to-first-token target in seconds.")
    tpot_target_s: float = Field(gt=0, description="Time-per-output-token target in seconds.")
    e2e_target_s: float = Field(gt=0, description="End-to-end latency target in seconds.")
    may_preempt_lower_tiers: bool = Field(
        default=False, description="Whether at-risk requests of this class jump ahead of laxer tiers."
    )


class FairShareSettings(_Frozen):
    """Bounds of the waiting queue and the SLA at-risk margin."""

    max_queue_per_tenant: int = Field(default=256, gt=0, description="Waiting requests per tenant, at most.")
    max_queue_total: int = Field(default=10_000, gt=0, description="Waiting requests overall, at most.")
    at_risk_margin_s: float = Field(
        default=0.05, ge=0, description="Seconds before the TTFT deadline when a request is at risk."
    )
    at_risk_margin_fraction: float = Field(
        default=0.75,
        ge=0,
        le=1,
        description="Extra margin as a fraction of the class's TTFT target: a request is at risk once "
        "(1 - fraction) of its target has passed, leaving the rest for the replica's queue and prefill.",
    )
    cached_prompt_token_cost: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Fair-share charge of a prompt token served from the prefix cache, relative to a "
        "computed one (1); providers bill cached input at a similar discount.",
    )


class TenancyConfig(_Frozen):
    """The whole tenancy configuration, checked across objects."""

    sla_classes: tuple[SLAClass, ...] = Field(min_length=1, description="Available SLA classes.")
    tenants: tuple[Tenant, ...] = Field(description="Configured tenants.")
    key_salt: SecretStr = Field(
        description=f"Per-deployment secret (at least {MIN_SALT_LENGTH} characters) keying the HMAC of every "
        "API key; kept with the hashes, masked in repr and JSON dumps.",
    )
    admin_key_hash: KeyHash = Field(description="HMAC of the admin API key ('hmac-sha256:<hex>').")
    metrics_key_hash: KeyHash | None = Field(
        default=None,
        description="HMAC of a key that may read /metrics and nothing else (a scraper's); the admin key "
        "may read it too.",
    )
    gpu_dollars_per_hour: float = Field(default=5.0, ge=0, description="GPU price for cost reports (USD/h).")
    fair_share: FairShareSettings = Field(
        default_factory=FairShareSettings, description="Queue bounds and SLA margin."
    )

    @field_validator("key_salt")
    @classmethod
    def _salt_long_enough(cls, value: SecretStr) -> SecretStr:
        check_salt(value.get_secret_value())  # KeySaltError is a ValueError: reported under key_salt
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> TenancyConfig:
        _unique([c.name for c in self.sla_classes], "sla_classes", "name")
        _unique([t.id for t in self.tenants], "tenants", "id")
        names = {c.name for c in self.sla_classes}
        for i, tenant in enumerate(self.tenants):
            if tenant.sla_class not in names:
                raise ValueError(f"tenants.{i}.sla_class: unknown SLA class {tenant.sla_class!r}")
        hashes = [h for t in self.tenants for h in t.api_key_hashes] + [self.admin_key_hash]
        hashes += [self.metrics_key_hash] if self.metrics_key_hash else []
        _unique(hashes, "tenants", "api_key_hashes (across tenants, admin_key_hash and metrics_key_hash)")
        return self

    @cached_property
    def tenants_by_id(self) -> Mapping[str, Tenant]:
        return {t.id: t for t in self.tenants}

    @cached_property
    def classes_by_name(self) -> Mapping[str, SLAClass]:
        return {c.name: c for c in self.sla_classes}

    def tenant(self, tenant_id: str) -> Tenant:
        found = self.tenants_by_id.get(tenant_id)
        if found is None:
            raise UnknownTenantError(tenant_id)
        return found

    def sla_class_of(self, tenant_id: str) -> SLAClass:
        return self.classes_by_name[self.tenant(tenant_id).sla_class]

    def for_model(self, model: str) -> TenancyConfig:
        """The config as one model's pool enforces it: each tenant with its quotas on ``model``."""
        if not any(q.model == model for t in self.tenants for q in t.model_quotas):
            return self
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return TenancyConfig.model_validate(fields | {"tenants": [t.on_model(model) for t in self.tenants]})

    def check_models(self, served: Iterable[str]) -> None:
        """Every model a tenant names (``models``, ``model_quotas``) is served; ``TenancyConfigError``
        lists those that are not (a typo would otherwise lock a tenant out of its model quietly)."""
        known = set(served)
        problems = []
        for i, tenant in enumerate(self.tenants):
            quota_models = [q.model for q in tenant.model_quotas]
            for field, names in (("models", tenant.models or ()), ("model_quotas", quota_models)):
                problems += [
                    f"tenants.{i}.{field}: {n!r} is not a served model" for n in names if n not in known
                ]
        if problems:
            raise TenancyConfigError(
                f"tenancy config names models this app does not serve ({', '.join(sorted(known))})",
                tuple(problems),
            )


def _unique(values: list[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value in seen:
            shown = "<hash>" if is_key_hash(value) else repr(value)
            raise ValueError(f"{where}.{i}.{what}: duplicate value {shown}")
        seen.add(value)
