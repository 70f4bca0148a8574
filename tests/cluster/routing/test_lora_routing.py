"""LoRA adapters at the router (issue 44): which tenant may use which adapter, how a request's
`model` resolves to a base model's pool and an adapter, the config's checks, the replica choice, and
the ledger row. The end-to-end path through Serve and the engine is tests/cluster/test_lora_api.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.config import AppConfig
from cluster.edge.job_builder import JobBuilder
from cluster.edge.openai_schemas import CompletionRequest
from cluster.errors import NotFound
from cluster.ledger.rows import LedgerRow, Pricing, row_from_timing
from cluster.routing.adapter_registry import Adapter
from cluster.routing.replica_ranking import ADAPTER_MISS_TOKENS, ReplicaState, replica_cost
from cluster.routing.router_core import RouterCore
from cluster.serving.wire import GenerateArgs
from cluster.telemetry.request_timing import RequestTiming
from cluster.text.prompts import PromptEncoder
from tenancy import default_tenancy_config

BASE = "smollm2-135m"


class _Handle:
    def options(self, **_):
        return self


def _config(**engine) -> AppConfig:
    return AppConfig(engine={"device": "cpu", "lora_slots": 2, **engine})


def _tenancy(grants: dict[str, tuple[str, ...]]):
    """The default tenants, each granted the adapters ``grants`` names for it."""
    config = default_tenancy_config()
    tenants = [t.model_copy(update={"adapters": grants.get(t.id, ())}) for t in config.tenants]
    return config.model_copy(update={"tenants": tuple(tenants)})


@pytest.fixture
def core() -> RouterCore:
    config = _config(lora_adapters={"acme-sql": "/adapters/acme-sql", "beta-chat": "/adapters/beta"})
    tenancy = default_tenancy_config()
    first, second = tenancy.tenants[0].id, tenancy.tenants[1].id
    return RouterCore(config, _Handle(), _tenancy({first: ("acme-sql",), second: ("beta-chat",)}))  # type: ignore[arg-type]


def test_a_tenant_reaches_its_own_adapter_on_the_base_models_pool(core: RouterCore) -> None:
    owner = core.tenancy.config.tenants[0]
    pool, adapter = core.resolve(owner, "acme-sql")
    assert pool.name == BASE and adapter == Adapter("acme-sql", BASE, "/adapters/acme-sql")
    assert core.resolve(owner, BASE) == (core.pools[BASE], None)


def test_another_tenants_adapter_is_the_same_404_as_an_unknown_name(core: RouterCore) -> None:
    owner = core.tenancy.config.tenants[0]
    with pytest.raises(NotFound) as other:
        core.resolve(owner, "beta-chat")
    with pytest.raises(NotFound) as unknown:
        core.resolve(owner, "no-such-adapter")
    assert other.value.code == unknown.value.code == "model_not_found"
    assert str(other.value).replace("beta-chat", "X") == str(unknown.value).replace("no-such-adapter", "X")


def test_the_model_list_shows_each_tenant_its_own_adapters(core: RouterCore) -> None:
    first, second, third = core.tenancy.config.tenants[:3]
    assert [a.name for a in core.adapters_of(first)] == ["acme-sql"]
    assert [a.name for a in core.adapters_of(second)] == ["beta-chat"]
    assert core.adapters_of(third) == []


def test_adapters_registered_at_run_time_join_and_leave(core: RouterCore) -> None:
    owner = core.tenancy.config.tenants[0]
    granted = owner.model_copy(update={"adapters": ("acme-sql", "late")})
    with pytest.raises(NotFound):
        core.resolve(granted, "late")
    core.adapters.replace_runtime([Adapter("late", BASE, "/adapters/late", source="admin")])
    assert core.resolve(granted, "late")[1] == Adapter("late", BASE, "/adapters/late", source="admin")
    core.adapters.replace_runtime([])
    with pytest.raises(NotFound):
        core.resolve(granted, "late")


def test_a_run_time_name_may_not_shadow_a_model_or_a_configured_adapter(core: RouterCore) -> None:
    assert core.adapters.conflict(BASE, core.pools) is not None
    assert core.adapters.conflict("acme-sql", core.pools) is not None
    assert core.adapters.conflict("fresh", core.pools) is None


def test_the_config_refuses_adapters_without_slots_and_names_that_collide() -> None:
    with pytest.raises(ValidationError, match="lora_slots"):
        AppConfig(engine={"device": "cpu", "lora_adapters": {"a": "/x"}})
    with pytest.raises(ValidationError, match="served model"):
        _config(lora_adapters={BASE: "/x"})
    with pytest.raises(ValidationError, match="max_lora_rank"):
        _config(max_lora_rank=65)
    with pytest.raises(ValidationError, match="not a valid model name"):
        _config(lora_adapters={"bad name": "/x"})


def test_prefix_cache_scopes_of_an_adapter_and_the_base_differ() -> None:
    base = GenerateArgs("r", [1, 2, 3], tenant="t")
    tuned = GenerateArgs("r", [1, 2, 3], tenant="t", adapter="a", adapter_path="/a")
    other = GenerateArgs("r", [1, 2, 3], tenant="t", adapter="b", adapter_path="/b")
    assert len({base.cache_scope(), tuned.cache_scope(), other.cache_scope()}) == 3
    assert GenerateArgs.from_wire(tuned.as_wire()) == tuned


def test_a_replica_without_the_adapter_costs_more_until_the_holder_is_busier() -> None:
    holder = ReplicaState(waiting_tokens=100, ongoing=1)
    cold = ReplicaState(waiting_tokens=100, ongoing=1, adapter_missing=True)
    assert replica_cost(holder, 10) < replica_cost(cold, 10)
    busy_holder = ReplicaState(waiting_tokens=100 + ADAPTER_MISS_TOKENS + 50, ongoing=1)
    assert replica_cost(cold, 10) < replica_cost(busy_holder, 10)  # a hot adapter spreads


async def test_jobs_carry_the_adapter_and_only_its_name_selects_it() -> None:
    async def context() -> int:
        return 2048

    builder = JobBuilder(AppConfig(), PromptEncoder.for_model(BASE, random_weights=False), context)
    tenant = default_tenancy_config().tenants[0]
    adapter = Adapter("acme-sql", BASE, "/adapters/acme-sql")
    job = await builder.build("r1", tenant, CompletionRequest(model="acme-sql", prompt="hi"), adapter)
    assert (job.adapter, job.adapter_path) == ("acme-sql", "/adapters/acme-sql")
    with pytest.raises(NotFound):  # the base model's name with an adapter resolved: a mismatch
        await builder.build("r2", tenant, CompletionRequest(model=BASE, prompt="hi"), adapter)
    other_base = Adapter("acme-sql", "another-model", "/x")
    with pytest.raises(NotFound):
        await builder.build("r3", tenant, CompletionRequest(model="acme-sql", prompt="hi"), other_base)


def test_the_ledger_row_names_the_adapter_and_old_spills_still_read() -> None:
    timing = RequestTiming("r1", "t", "standard", 1.0, model=BASE, adapter="acme-sql")
    timing.end = 2.0
    row = row_from_timing(timing, "app", "router", Pricing(5.0, 8))
    assert (row.model, row.adapter) == (BASE, "acme-sql")
    written_before = {k: v for k, v in row.to_dict().items() if k != "adapter"}
    assert LedgerRow.from_dict(written_before).adapter is None
