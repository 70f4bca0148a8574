"""``fairlane report``: figures, HTML and terminal tables from one run folder, or two compared."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from loadtest.agreement import tenant_agreement, ttft_deltas
from loadtest.compare import compare_rows, quiet_ttft_p99_ratio
from loadtest.figures import run_figures, ttft_compare
from loadtest.html_report import page, print_tables
from loadtest.run_dir import read_run_records, read_server, read_summary, write_json
from loadtest.tables import compare_table, fairness_table, ms, share_table, summary_table

REPORT_FILE = "report.html"
NOTES = (
    "TTFT = first streamed chunk − send; TPOT = (E2E − TTFT)/(output tokens − 1); ITL = gaps between "
    "content chunks; percentiles interpolate linearly (as vllm bench serve). SLA attainment = requests "
    "meeting every target of their class / requests served (429 rejections excluded). Service = "
    "(input tokens × 1 + output tokens × 2) / tenant weight; the max service gap compares tenants "
    "backlogged for a whole window. Warm-up requests are left out of every figure and table.",
)


def agreement_table(run: Path) -> Table | None:
    """Client vs the cluster's /admin/sla on the same run, when the run fetched it."""
    sla = read_server(run, "sla")
    if sla is None:
        return None
    records = read_run_records(run)
    table = Table(title="client vs cluster SLA report (all requests, nearest-rank percentiles)")
    for col in ("tenant", "requests c/s", "ok c/s", "429 c/s", "TTFT p50 c/s ms", "TTFT p99 c/s ms"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for tid, a in tenant_agreement(records, sla).items():
        table.add_row(
            tid,
            f"{a['client_requests']}/{a['server_requests']}",
            f"{a['client_ok']}/{a['server_ok']}",
            f"{a['client_rejected']}/{a['server_rejected']}",
            f"{ms(a['client_ttft_p50'])}/{ms(a['server_ttft_p50'])}",
            f"{ms(a['client_ttft_p99'])}/{ms(a['server_ttft_p99'])}",
        )
    timings = read_server(run, "timings")
    if timings is not None:
        deltas = sorted(ttft_deltas(records, timings))
        if deltas:
            table.caption = (
                f"per request, client − server TTFT over {len(deltas)} matched requests: "
                f"min {deltas[0] * 1000:.1f} ms, median {deltas[len(deltas) // 2] * 1000:.1f} ms, "
                f"max {deltas[-1] * 1000:.1f} ms"
            )
    return table


def render_run(run: Path, console: Console | None = None) -> Path:
    """Figures + report.html into the run folder; tables to the terminal. Returns the HTML path."""
    summary = read_summary(run)
    records = read_run_records(run)
    figures = run_figures(records, summary, run / "figures")
    tables = [summary_table(summary), fairness_table(summary)]
    shares = share_table(summary)
    if shares is not None:
        tables.append(shares)
    agreement = agreement_table(run)
    if agreement is not None:
        tables.append(agreement)
    print_tables(tables, console)
    meta = summary["meta"]
    notes = (
        f"scenario {meta['scenario']} against {meta['url']}: {meta['duration_s']:.0f}s of load, "
        f"{meta['warmup_s']:.0f}s warm-up, run took {meta['elapsed_s']:.0f}s.",
        *NOTES,
    )
    path = run / REPORT_FILE
    path.write_text(page(f"fairlane load test: {meta['scenario']}", notes, tables, figures), encoding="utf-8")
    return path


def render_compare(
    run_a: Path, run_b: Path, out: Path, console: Console | None = None, labels: tuple[str, str] | None = None
) -> Path:
    """Two runs side by side: a comparison table, both runs' tables and figures, one HTML page."""
    labels = labels or (run_a.name, run_b.name)
    a, b = read_summary(run_a), read_summary(run_b)
    out.mkdir(parents=True, exist_ok=True)
    rows = compare_rows(a, b)
    quiet = quiet_ttft_p99_ratio(a, b)
    write_json(
        out / "compare.json",
        {
            "labels": labels,
            "rows": rows,
            "quiet_ttft_p99_ratio_b_over_a": quiet,
            "fairness": {
                labels[0]: a["fairness"] | {"service": None},
                labels[1]: b["fairness"] | {"service": None},
            },
        },
    )
    tables = [
        compare_table(rows, labels),
        summary_table(a, f"A = {labels[0]}"),
        summary_table(b, f"B = {labels[1]}"),
    ]
    print_tables(tables, console)
    figs = [
        ttft_compare(read_run_records(run_a), read_run_records(run_b), labels, out / "ttft_cdf_compare.png")
    ]
    for tag, run, summary in (("a", run_a, a), ("b", run_b, b)):
        figs += run_figures(read_run_records(run), summary, out / f"figures_{tag}")
    notes = (
        f"A = {run_a}, B = {run_b}. Quiet tenants' TTFT p99 ratio B/A: "
        + ", ".join(f"{t} {v:.2f}" if v is not None else f"{t} -" for t, v in quiet.items()),
        *NOTES,
    )
    path = out / REPORT_FILE
    path.write_text(
        page(f"fairlane load test: {labels[0]} vs {labels[1]}", notes, tables, figs), encoding="utf-8"
    )
    return path
