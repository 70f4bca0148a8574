"""SLA report: latency percentiles, attainment, goodput and cost per tenant, SLA class and model."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from cluster.telemetry.request_timing import RequestTiming
from tenancy import SLAClass, TenancyConfig

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class GroupReport:
    """One tenant (or class, or model) over the window: counts, latency percentiles, attainment, cost.

    ``model`` is "*" for the tenant and class groups (every model), a served name for a model's.
    """

    tenant_id: str
    sla_class: str
    requests: int
    ok: int
    rejected: int
    failed: int
    output_tokens: int
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    e2e_s: dict[str, float | None]
    sla_attainment: float | None
    goodput_rps: float
    dollars_per_success: float | None
    model: str = "*"


@dataclass(frozen=True, slots=True)
class SLAReport:
    window_s: float
    replica_seconds: float
    gpu_dollars: float
    tenants: list[GroupReport]
    classes: list[GroupReport]
    # Per served model: its own requests, and its replicas' seconds priced alone.
    models: list[GroupReport] = field(default_factory=list)
    model_replica_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (no interpolation), None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def meets_sla(record: RequestTiming, target: SLAClass) -> bool:
    """A successful request within its class's TTFT, TPOT and E2E targets."""
    if record.outcome != "ok" or record.ttft is None or record.e2e is None:
        return False
    tpot_ok = record.tpot is None or record.tpot <= target.tpot_target_s
    return record.ttft <= target.ttft_target_s and tpot_ok and record.e2e <= target.e2e_target_s


def build_report(
    records: Iterable[RequestTiming],
    config: TenancyConfig,
    window_s: float,
    replica_seconds: float,
    model_replica_seconds: Mapping[str, float] | None = None,
) -> SLAReport:
    """Group finished records by tenant, by class and by model. A tenant's or class's cost is its
    token share of ``replica_seconds``, which are what ``records`` used: every replica's in the
    admin's report, only the seconds a tenant's own requests held in that tenant's report
    (``cluster/edge/tenant_views.py``), never the cluster's. A model's cost is its own replicas'
    (``model_replica_seconds``; None: no model groups, as in a tenant's own report, whose records
    are not all of a model's)."""
    records = [r for r in records if r.end is not None]
    price = config.gpu_dollars_per_hour / 3600.0
    dollars = replica_seconds * price
    total_tokens = sum(r.prompt_tokens + r.output_tokens for r in records if r.outcome == "ok") or 0
    by_tenant: dict[str, list[RequestTiming]] = {}
    by_class: dict[str, list[RequestTiming]] = {}
    by_model: dict[str, list[RequestTiming]] = {}
    for r in records:
        by_tenant.setdefault(r.tenant_id, []).append(r)
        by_class.setdefault(r.sla_class, []).append(r)
        by_model.setdefault(r.model, []).append(r)
    window = max(window_s, 1e-9)
    tenants = [
        _group(rs, tid, rs[0].sla_class, config, window, dollars, total_tokens)
        for tid, rs in sorted(by_tenant.items())
    ]
    classes = [
        _group(rs, "*", name, config, window, dollars, total_tokens) for name, rs in sorted(by_class.items())
    ]
    seconds = dict(model_replica_seconds or {})
    models = []
    for name, rs in sorted(by_model.items()) if model_replica_seconds is not None else ():
        own = seconds.get(name, 0.0) * price
        tokens = sum(r.prompt_tokens + r.output_tokens for r in rs if r.outcome == "ok")
        models.append(_group(rs, "*", "*", config, window, own, tokens, model=name))
    return SLAReport(window_s, replica_seconds, dollars, tenants, classes, models, seconds)


def _group(
    records: list[RequestTiming],
    tenant_id: str,
    sla_class: str,
    config: TenancyConfig,
    window: float,
    dollars: float,
    total_tokens: int,
    model: str = "*",
) -> GroupReport:
    ok = [r for r in records if r.outcome == "ok"]
    # Each record against its own class's targets (a model's group mixes classes).
    targets = config.classes_by_name
    met = sum(1 for r in ok if r.sla_class in targets and meets_sla(r, targets[r.sla_class]))
    served = [r for r in records if r.outcome != "rejected"]
    tokens = sum(r.prompt_tokens + r.output_tokens for r in ok)
    share = dollars * tokens / total_tokens if total_tokens else 0.0
    return GroupReport(
        tenant_id=tenant_id,
        sla_class=sla_class,
        requests=len(records),
        ok=len(ok),
        rejected=sum(1 for r in records if r.outcome == "rejected"),
        failed=len(served) - len(ok),
        output_tokens=sum(r.output_tokens for r in ok),
        ttft_s=_percentiles([r.ttft for r in ok]),
        tpot_s=_percentiles([r.tpot for r in ok]),
        e2e_s=_percentiles([r.e2e for r in ok]),
        sla_attainment=met / len(served) if served else None,
        goodput_rps=met / window,
        dollars_per_success=share / len(ok) if ok else None,
        model=model,
    )


def _percentiles(values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    return {f"p{p}": percentile(present, p) for p in PERCENTILES}
