"""Scenario files: pydantic models (extra="forbid") for tenants, arrivals and length distributions."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tenancy import SLAClass, default_tenancy_config

SCENARIO_DIR = Path(__file__).parent / "scenarios"


# The realistic mix, the mix without its JSON schemas, or all greedy (loadtest/sampling_mix.py).
Sampling = Literal["mix", "mix_without_schemas", "greedy"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixedLength(_Strict):
    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(gt=0, description="Every request uses this many tokens.")


class UniformLength(_Strict):
    kind: Literal["uniform"] = "uniform"
    min: int = Field(gt=0, description="Smallest length (inclusive).")
    max: int = Field(gt=0, description="Largest length (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


class BundledPrompts(_Strict):
    """Real chat prompts from ``loadtest/data/chat_prompts.jsonl`` (their own lengths)."""

    kind: Literal["bundled"] = "bundled"
    max_words: int | None = Field(default=None, gt=0, description="Skip prompts longer than this.")


PromptLength = Annotated[FixedLength | UniformLength | BundledPrompts, Field(discriminator="kind")]
OutputLength = Annotated[FixedLength | UniformLength, Field(discriminator="kind")]


class Arrival(_Strict):
    """How an open-loop tenant's requests arrive (``vllm bench serve`` conventions)."""

    process: Literal["poisson", "gamma", "constant", "on_off"] = Field(
        default="poisson", description="Inter-arrival law; on_off = Poisson during on-periods only."
    )
    burstiness: float = Field(
        default=1.0, gt=0, description="Gamma shape; 1 is Poisson, <1 burstier, >1 more regular."
    )
    on_s: float = Field(default=5.0, gt=0, description="on_off: seconds of each burst.")
    off_s: float = Field(default=5.0, ge=0, description="on_off: seconds of silence between bursts.")


class TenantLoad(_Strict):
    """One tenant's traffic: open loop (``rate``) or closed loop (``concurrency``)."""

    id: str = Field(min_length=1, description="Tenant id as the server knows it (labels the report).")
    api_key: str = Field(min_length=1, description="Bearer key sent with every request.")
    sla_class: str = Field(min_length=1, description="SLA class whose targets judge this tenant.")
    weight: float = Field(default=1.0, gt=0, description="Fair-share weight (normalises its service).")
    rate: float | None = Field(default=None, gt=0, description="Requests per second (open loop).")
    concurrency: int | None = Field(default=None, gt=0, description="Requests kept in flight (closed loop).")
    arrival: Arrival = Field(default_factory=Arrival, description="Arrival process for rate mode.")
    start_s: float = Field(default=0.0, ge=0, description="Open loop: the first send no earlier (a burst).")
    end_s: float | None = Field(default=None, gt=0, description="Open loop: no send from here on.")
    prompt: PromptLength = Field(default_factory=BundledPrompts, description="Prompt lengths (words).")
    output: OutputLength = Field(default_factory=lambda: FixedLength(tokens=32), description="max_tokens.")
    sampling: Sampling | None = Field(
        default=None, description="This tenant's sampling; None = the scenario's."
    )

    @model_validator(mode="after")
    def _one_mode(self) -> TenantLoad:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate or concurrency")
        if self.concurrency is not None and (self.start_s or self.end_s is not None):
            raise ValueError("start_s and end_s are for open-loop tenants (rate)")
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError("end_s must come after start_s")
        return self


class Scenario(_Strict):
    """A whole multi-tenant run."""

    name: str = Field(min_length=1)
    description: str = Field(default="")
    model: str = Field(default="smollm2-135m", description="Model name sent in each request.")
    endpoint: Literal["chat", "completions"] = Field(default="chat")
    duration_s: float = Field(gt=0, description="Seconds during which new requests are sent.")
    warmup_s: float = Field(default=0.0, ge=0, description="Requests sent before this are not measured.")
    seed: int = Field(default=0, description="Seeds arrivals, prompt choice and lengths.")
    max_requests: int = Field(default=5000, gt=0, description="Requests sent at most, all tenants.")
    max_in_flight: int = Field(default=512, gt=0, description="Open connections at most, all tenants.")
    client_procs: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Processes that send the load (each every n-th planned request and closed-loop worker, one "
            "clock): one asyncio process reading thousands of streamed tokens a second falls behind."
        ),
    )
    request_timeout_s: float = Field(default=120.0, gt=0, description="One request's bound, end to end.")
    drain_timeout_s: float | None = Field(
        default=None,
        ge=0,
        description=(
            "A cap on the drain after duration_s (what is still open then is cut, reported apart); "
            "None: only the bound loadtest/drain.py computes, long enough for every admitted request."
        ),
    )
    first_token_timeout_s: float = Field(
        default=180.0,
        gt=0,
        description=(
            "The drain's allowance for a request still without its first token: fairlane's queue_timeout_s "
            "(60) + first_token_timeout_s (120), after which the server ends such a request itself."
        ),
    )
    gpu_dollars_per_hour: float = Field(default=5.0, ge=0, description="Price of one replica-hour.")
    sampling: Sampling = Field(
        default="mix",
        description=(
            "Requests' sampling: the realistic mix (loadtest/sampling_mix.py), the mix without its JSON "
            "schemas (for a model whose tokenizer cannot constrain output, such as the synthetic word "
            "tokenizer of random-weight presets), or all greedy."
        ),
    )
    sla_classes: tuple[SLAClass, ...] | None = Field(
        default=None, description="SLA targets; None = the tenancy default classes."
    )
    tenants: tuple[TenantLoad, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _checks(self) -> Scenario:
        ids = [t.id for t in self.tenants]
        if len(set(ids)) != len(ids):
            raise ValueError("tenant ids must be unique")
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        names = {c.name for c in self.classes}
        for i, t in enumerate(self.tenants):
            if t.sla_class not in names:
                raise ValueError(f"tenants.{i}.sla_class: unknown SLA class {t.sla_class!r}")
        return self

    @property
    def classes(self) -> tuple[SLAClass, ...]:
        return self.sla_classes or default_tenancy_config().sla_classes

    def sampling_of(self, load: TenantLoad) -> str:
        return load.sampling or self.sampling

    def class_of(self, tenant_id: str) -> SLAClass:
        tenant = next(t for t in self.tenants if t.id == tenant_id)
        return next(c for c in self.classes if c.name == tenant.sla_class)

    def scaled(self, scale: float = 1.0, duration_s: float | None = None) -> Scenario:
        """Rates and concurrencies × ``scale``; a new duration keeps the warm-up's share of it, and
        each tenant's send window (``start_s``, ``end_s``) its place in it."""
        if scale <= 0:
            raise ValueError("scale must be > 0")
        duration = self.duration_s if duration_s is None else duration_s
        stretch = duration / self.duration_s
        tenants = tuple(
            t.model_copy(
                update={
                    "rate": None if t.rate is None else t.rate * scale,
                    "concurrency": None
                    if t.concurrency is None
                    else max(1, math.ceil(t.concurrency * scale)),
                    "start_s": t.start_s * stretch,
                    "end_s": None if t.end_s is None else t.end_s * stretch,
                }
            )
            for t in self.tenants
        )
        warmup = self.warmup_s * duration / self.duration_s
        return Scenario.model_validate(
            self.model_dump()
            | {"tenants": [t.model_dump() for t in tenants], "duration_s": duration, "warmup_s": warmup}
        )


class ScenarioError(ValueError):
    """A scenario file that cannot be read or does not validate; the message names the field."""


def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (``steady``) or a YAML file path."""
    path = Path(name_or_path)
    if not path.exists():
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ScenarioError(f"no scenario {name_or_path!r}; shipped: {', '.join(shipped_scenarios())}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Scenario.model_validate(data)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ScenarioError(f"{path}: {problems}") from None
