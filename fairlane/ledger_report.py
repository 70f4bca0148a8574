"""``fairlane report --ledger DSN --from ... --to ...``: the ledger's SLA report and usage over a range,
as terminal tables, PNG figures and one HTML page (the load-test report's page and table style)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from cluster.ledger.sla_query import ledger_report
from cluster.ledger.store import LedgerStore
from cluster.ledger.time_range import BUCKETS, time_range
from cluster.ledger.usage_query import UsageResult, usage_csv, usage_results
from cluster.telemetry.sla_report import GroupReport, SLAReport
from loadtest.html_report import page, print_tables
from tenancy import TenancyConfig, default_tenancy_config, load_tenancy_config

NOTES = (
    "From the request ledger: one row per finished request of every router. TTFT, TPOT "
    "(= (E2E − TTFT)/(output tokens − 1)) and E2E over successful requests, nearest-rank percentiles. "
    "SLA attainment = requests meeting every target of their class / requests served (rejections "
    "excluded). Cost = each request's slot-seconds (dispatch to end ÷ its replica's room) × the "
    "tenancy's gpu_dollars_per_hour.",
)


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def group_table(title: str, groups: list[GroupReport], key: str) -> Table:
    table = Table(title=title)
    columns = [key, "requests", "ok", "rejected", "failed", "out tokens", "TTFT p50/p99 ms"]
    columns += ["TPOT p50/p99 ms", "E2E p99 ms", "attainment", "$/success"]
    for col in columns:
        table.add_column(col, justify="left" if col == key else "right")
    for g in groups:
        name = {"tenant": g.tenant_id, "class": g.sla_class, "model": g.model}[key]
        table.add_row(
            name,
            str(g.requests),
            str(g.ok),
            str(g.rejected),
            str(g.failed),
            str(g.output_tokens),
            f"{ms(g.ttft_s['p50'])}/{ms(g.ttft_s['p99'])}",
            f"{ms(g.tpot_s['p50'])}/{ms(g.tpot_s['p99'])}",
            ms(g.e2e_s["p99"]),
            "-" if g.sla_attainment is None else f"{100 * g.sla_attainment:.1f}%",
            "-" if g.dollars_per_success is None else f"{g.dollars_per_success:.6f}",
        )
    return table


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attainment_figure(classes: list[GroupReport], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [c.sla_class for c in classes]
    ax.bar(
        names, [100 * (c.sla_attainment or 0.0) for c in classes], color=[f"C{i}" for i in range(len(names))]
    )
    ax.set_ylim(0, 105)
    ax.set_ylabel("SLA attainment (% of served requests)")
    ax.set_title("SLA attainment per class")
    return _save(fig, path)


def cost_figure(tenants: list[GroupReport], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    cost = [(g.dollars_per_success or 0.0) * g.ok for g in tenants]
    ax.barh([g.tenant_id for g in tenants], cost, color="C2")
    ax.set_xlabel("USD over the range")
    ax.set_title("Cost per tenant")
    return _save(fig, path)


def usage_figure(results: list[UsageResult], path: Path) -> Path:
    """Output tokens per bucket, one line per tenant."""
    series: dict[str, dict[int, int]] = {}
    for r in results:
        per = series.setdefault(r.tenant_id, {})
        per[r.start_time] = per.get(r.start_time, 0) + r.output_tokens
    fig, ax = plt.subplots(figsize=(6, 4))
    for tenant, points in sorted(series.items()):
        xs = sorted(points)
        ax.plot(
            [time.strftime("%m-%d %H:%M", time.gmtime(x)) for x in xs], [points[x] for x in xs], label=tenant
        )
    ax.set_ylabel("output tokens per bucket")
    ax.set_title("Usage over the range")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    if series:
        ax.legend(fontsize=7)
    return _save(fig, path)


async def gather(
    dsn: str, query: dict[str, str], tenancy: TenancyConfig, app: str | None
) -> tuple[SLAReport, list[UsageResult], dict]:
    rng = time_range(query, time.time() - 30 * 86400, time.time())
    store = LedgerStore(dsn)
    try:
        width = BUCKETS[query.get("bucket_width", "1d")]
        both = await ledger_report(store, tenancy, rng, app=app, width=width)
    finally:
        await store.close()
    results, outcomes = usage_results(both.sums, width)
    meta = {"from": rng.start, "to": rng.end, "outcomes": dict(outcomes), "percentiles": both.percentiles}
    return both.sla, results, meta


def render_ledger(
    dsn: str,
    start: str | None,
    end: str | None,
    out: Path,
    tenancy_file: Path | None = None,
    app: str | None = None,
    bucket: str = "1d",
    console: Console | None = None,
) -> Path:
    """Tables to the terminal; report.html, figures, sla.json and usage.csv into ``out``."""
    query = {k: v for k, v in (("from", start), ("to", end), ("bucket_width", bucket)) if v is not None}
    tenancy = load_tenancy_config(tenancy_file) if tenancy_file else default_tenancy_config()
    began = time.perf_counter()
    report, results, meta = asyncio.run(gather(dsn, query, tenancy, app))
    took = time.perf_counter() - began
    out.mkdir(parents=True, exist_ok=True)
    tables = [
        group_table("per tenant", report.tenants, "tenant"),
        group_table("per SLA class", report.classes, "class"),
        group_table("per model", report.models, "model"),
    ]
    print_tables(tables, console)
    figures = [
        attainment_figure(report.classes, out / "sla_attainment.png"),
        cost_figure(report.tenants, out / "cost_by_tenant.png"),
        usage_figure(results, out / "usage.png"),
    ]
    span = f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(meta['from']))} to "
    span += f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(meta['to']))} UTC"
    (out / "sla.json").write_text(json.dumps(report.to_dict() | meta | {"query_s": took}, indent=2) + "\n")
    (out / "usage.csv").write_text(usage_csv(results))
    (out / "usage.json").write_text(json.dumps([asdict(r) for r in results]) + "\n")
    path = out / "report.html"
    requests = sum(meta["outcomes"].values())
    notes = (f"{span}; {requests} requests; read in {took:.2f} s; {meta['percentiles']} percentiles.", *NOTES)
    path.write_text(page("fairlane ledger report", notes, tables, figures), encoding="utf-8")
    return path
