"""``fairlane demo``: a short multi-tenant load on the embedded cluster, then a per-tenant SLA table.

Three demo tenants: alice (interactive) asks one question at a time, bob (standard) keeps two
requests going, carol (batch) floods with many. Everything runs locally: no GPU, Redis or network.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.table import Table

from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS

QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colours.",
    "What is two plus two?",
    "Give me a synonym for happy.",
)


@dataclass(frozen=True, slots=True)
class TenantLoad:
    tenant: str
    concurrency: int
    max_tokens: int


DEMO_LOAD = (TenantLoad("alice", 1, 12), TenantLoad("bob", 2, 16), TenantLoad("carol", 8, 32))


async def _worker(client: httpx.AsyncClient, load: TenantLoad, model: str, until: float, i: int) -> None:
    headers = {"Authorization": f"Bearer {DEMO_KEYS[load.tenant]}"}
    n = i
    while time.monotonic() < until:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}],
            "max_tokens": load.max_tokens,
            "temperature": 0.7,
            "seed": n,
        }
        n += 1
        r = await client.post("/v1/chat/completions", json=body, headers=headers)
        if r.status_code == 429:  # honour Retry-After, as a well-behaved client does
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))


async def run_load(base_url: str, model: str, duration_s: float) -> dict:
    """Drive the demo load for ``duration_s``; returns the admin SLA report."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        admin = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
        await client.post("/admin/timings/reset", headers=admin)
        until = time.monotonic() + duration_s
        tasks = [
            _worker(client, load, model, until, i) for load in DEMO_LOAD for i in range(load.concurrency)
        ]
        await asyncio.gather(*tasks)
        return (await client.get("/admin/sla", headers=admin)).json()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def sla_table(report: dict, title: str) -> Table:
    """A rich table: one row per tenant with latency percentiles, attainment and cost."""
    table = Table(title=title)
    for col in (
        "tenant",
        "class",
        "ok",
        "rejected",
        "out tok",
        "TTFT p50/p99 ms",
        "TPOT p50 ms",
        "E2E p99 ms",
        "SLA met",
        "goodput r/s",
        "$/success",
    ):
        table.add_column(col, justify="left" if col in ("tenant", "class") else "right")
    for g in report["tenants"]:
        attain = "-" if g["sla_attainment"] is None else f"{g['sla_attainment']:.0%}"
        cost = "-" if g["dollars_per_success"] is None else f"{g['dollars_per_success']:.6f}"
        table.add_row(
            g["tenant_id"],
            g["sla_class"],
            str(g["ok"]),
            str(g["rejected"]),
            str(g["output_tokens"]),
            f"{_ms(g['ttft_s']['p50'])}/{_ms(g['ttft_s']['p99'])}",
            _ms(g["tpot_s"]["p50"]),
            _ms(g["e2e_s"]["p99"]),
            attain,
            f"{g['goodput_rps']:.2f}",
            cost,
        )
    return table


def print_report(report: dict, console: Console | None = None) -> None:
    console = console or Console()
    title = (
        f"fairlane demo: {report['window_s']:.0f}s, {report['replica_seconds']:.0f} replica-s, "
        f"${report['gpu_dollars']:.4f} of GPU time"
    )
    console.print(sla_table(report, title))
