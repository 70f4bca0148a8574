"""The side-by-side table of the dispatch-policy benchmark (``bench.policy_run``): one column per policy."""

from __future__ import annotations

from rich.table import Table

from bench.policy_targets import Row, target_rows


def cell(value: float | None, unit: str, met: bool | None) -> str:
    if unit == "" and met is not None:
        return "met" if met else "missed"
    if value is None:
        return "-" if met is None else "- missed"
    text = {
        "s": f"{value:.3f}s",
        "%": f"{value:.1%}",
        "x": f"{value:.2f}×",
        "j": f"{value:.4f}",
        "tps": f"{value:,.0f}",
        "ms": f"{value:.1f} ms",
        "n": f"{value:,.0f}",
    }.get(unit, f"{value:g}")
    return text if met is None else f"{text} {'met' if met else 'missed'}"


def policy_table(results: dict) -> Table:
    """Figures (targets first, then per-tenant context) by scenario, one column per policy."""
    policies = list(results.get("policies_run") or results.get("runs", {}).keys())
    rows: list[Row] = target_rows(results)
    solo = results.get("solo", {}).get("quiet_ttft_p99_s")
    title = results.get("title", "dispatch policies")
    planned, took = results.get("schedule_estimate_s"), results.get("elapsed_s")
    timing = f"; planned {planned:.0f}s, took {took:.0f}s" if planned and took else ""
    table = Table(title=f"{title}; solo quiet TTFT p99 {cell(solo, 's', None)}{timing}")
    table.add_column("scenario")
    table.add_column("figure")
    table.add_column("target", justify="right")
    for p in policies:
        table.add_column(p, justify="right")
    last = None
    for r in rows:
        style = "bold" if r.target else "dim"
        name = r.scenario if r.scenario != last else ""
        last = r.scenario
        cells = [cell(r.values.get(p), r.unit, r.met.get(p)) for p in policies]
        table.add_row(name, r.label, r.target, *cells, style=style)
    for skipped in results.get("skipped", []):  # what the budget left out, and why
        table.add_row("skipped", skipped["phase"], skipped["why"], *("" for _ in policies), style="italic")
    for note in results.get("notes", []):
        table.add_row("note", note, "", *("" for _ in policies), style="italic")
    return table
