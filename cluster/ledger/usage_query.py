"""Usage from the ledger: buckets of an hour or a day × tenant × API key × model, shaped like
OpenAI's organization Usage API (a page of buckets, each with its results), or as CSV rows."""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import asdict, dataclass

from cluster.ledger.rollup_job import targets_signature
from cluster.ledger.rollup_plan import plan
from cluster.ledger.rollup_query import plan_sums
from cluster.ledger.store import LedgerStore
from cluster.ledger.summary import SumRow
from cluster.ledger.time_range import TimeRange
from tenancy import TenancyConfig

CSV_COLUMNS = (
    "start_time",
    "end_time",
    "tenant_id",
    "api_key_id",
    "model",
    "num_model_requests",
    "num_rejected",
    "input_tokens",
    "input_cached_tokens",
    "output_tokens",
    "cost_usd",
)


@dataclass(slots=True)
class UsageResult:
    """One bucket's figures for one (tenant, key, model)."""

    start_time: int
    end_time: int
    tenant_id: str
    api_key_id: str
    model: str
    num_model_requests: int
    num_rejected: int
    input_tokens: int
    input_cached_tokens: int
    output_tokens: int
    cost_usd: float


def usage_results(sums: list[SumRow], width: int) -> tuple[list[UsageResult], Counter[str]]:
    """The sums folded into (bucket, tenant, key, model) results, in time order, and the requests
    per outcome over the range."""
    results: dict[tuple, UsageResult] = {}
    outcomes: Counter[str] = Counter()
    for row in sorted(sums, key=lambda s: (s.start, s.tenant_id, s.api_key_id, s.model)):
        key = (row.start, row.tenant_id, row.api_key_id, row.model)
        res = results.get(key)
        if res is None:
            res = results[key] = UsageResult(row.start, row.start + width, *key[1:], 0, 0, 0, 0, 0, 0.0)
        res.num_model_requests += row.requests
        res.num_rejected += row.requests if row.outcome == "rejected" else 0
        res.input_tokens += row.input_tokens
        res.input_cached_tokens += row.cached_tokens
        res.output_tokens += row.output_tokens
        res.cost_usd += row.cost
        outcomes[row.outcome] += row.requests
    return list(results.values()), outcomes


async def usage_rows(
    store: LedgerStore,
    rng: TimeRange,
    width: int,
    config: TenancyConfig,
    app: str | None = None,
    tenant_id: str | None = None,
) -> tuple[list[UsageResult], Counter[str]]:
    """Usage alone: the sums per bucket, the rollup's whole hours and the rows of the rest."""
    async with store.connect() as conn:
        plan_ = await plan(conn, rng, app, tenant_id, targets_signature(config))
    return usage_results(await plan_sums(store, plan_, config, width), width)


def usage_page(results: list[UsageResult], outcomes: Counter[str], rng: TimeRange, width: int) -> dict:
    """OpenAI's page of buckets (``/v1/organization/usage/completions``: a tenant is a project), plus
    the totals over the range."""
    buckets: dict[int, list[dict]] = {}
    for res in results:
        item = {"object": "organization.usage.completions.result"} | asdict(res)
        item["project_id"] = item["tenant_id"]
        del item["start_time"], item["end_time"]
        buckets.setdefault(res.start_time, []).append(item)
    return {
        "object": "page",
        "data": [
            {"object": "bucket", "start_time": start, "end_time": start + width, "results": items}
            for start, items in sorted(buckets.items())
        ],
        "has_more": False,
        "next_page": None,
        "from": rng.start,
        "to": rng.end,
        "requests": sum(outcomes.values()),
        "outcomes": dict(sorted(outcomes.items())),
        "prompt_tokens": sum(x.input_tokens for x in results),
        "output_tokens": sum(x.output_tokens for x in results),
        "cost_usd": sum(x.cost_usd for x in results),
    }


def usage_csv(results: list[UsageResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for res in results:
        d = asdict(res)
        writer.writerow([d[c] if c != "cost_usd" else f"{d[c]:.8f}" for c in CSV_COLUMNS])
    return out.getvalue()
