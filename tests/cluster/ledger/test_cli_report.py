"""``fairlane report --ledger``: tables, figures, the HTML page and the usage CSV of a range."""

from __future__ import annotations

import asyncio
import csv
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from cluster.ledger.store import LedgerStore
from fairlane.cli import app
from tests.cluster.ledger.rows_factory import rows


async def _fill(dsn: str, n: int) -> None:
    store = LedgerStore(dsn)
    try:
        await store.migrate()
        await store.insert(rows(n, app="fairlane"))
    finally:
        await store.close()


def test_the_report_reads_the_ledger_over_a_range(dsn: str, tmp_path: Path) -> None:
    asyncio.run(_fill(dsn, 300))
    out = tmp_path / "report"
    start, end = f"{time.time() - 3600:.0f}", f"{time.time() + 60:.0f}"
    args = ["report", "--ledger", dsn, "--from", start, "--to", end, "--out", str(out), "--bucket", "1h"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "per tenant" in result.output and "per SLA class" in result.output
    for name in ("alice", "bob", "carol", "interactive", "standard", "batch"):
        assert name in result.output
    assert {p.name for p in out.iterdir()} >= {
        "report.html",
        "sla.json",
        "usage.csv",
        "sla_attainment.png",
        "cost_by_tenant.png",
        "usage.png",
    }
    sla = json.loads((out / "sla.json").read_text())
    assert sum(t["requests"] for t in sla["tenants"]) == 300
    usage = list(csv.DictReader((out / "usage.csv").open()))
    assert sum(int(r["num_model_requests"]) for r in usage) == 300
    assert "<img" in (out / "report.html").read_text()


def test_a_bad_range_is_refused(sqlite_dsn: str, tmp_path: Path) -> None:
    asyncio.run(_fill(sqlite_dsn, 5))
    result = CliRunner().invoke(
        app, ["report", "--ledger", sqlite_dsn, "--from", "soon", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0
