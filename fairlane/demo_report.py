"""The tables of ``fairlane demo``: one per dispatch policy, the two side by side, and what they mean."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


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
    ):
        table.add_column(col, justify="left" if col in ("tenant", "class") else "right")
    for g in report["tenants"]:
        table.add_row(
            g["tenant_id"],
            g["sla_class"],
            str(g["ok"]),
            str(g["rejected"]),
            str(g["output_tokens"]),
            f"{_ms(g['ttft_s']['p50'])}/{_ms(g['ttft_s']['p99'])}",
            _ms(g["tpot_s"]["p50"]),
            _ms(g["e2e_s"]["p99"]),
            _pct(g["sla_attainment"]),
            f"{g['goodput_rps']:.2f}",
        )
    return table


@dataclass(frozen=True, slots=True)
class QuietFigures:
    """The quiet tenants of one run, together: their worst TTFT p50/p99 and their SLA attainment."""

    ttft_p50_s: float | None
    ttft_p99_s: float | None
    sla_attainment: float | None
    ok: int


def _tenant(report: dict, tenant_id: str) -> dict | None:
    return next((g for g in report["tenants"] if g["tenant_id"] == tenant_id), None)


def quiet_figures(report: dict, quiet: Sequence[str]) -> QuietFigures:
    groups = [g for t in quiet if (g := _tenant(report, t)) is not None and g["ok"]]
    if not groups:
        return QuietFigures(None, None, None, 0)
    ok = sum(g["ok"] for g in groups)
    met = sum((g["sla_attainment"] or 0.0) * g["ok"] for g in groups)
    return QuietFigures(
        max(g["ttft_s"]["p50"] for g in groups),
        max(g["ttft_s"]["p99"] for g in groups),
        met / ok,
        ok,
    )


def side_by_side(reports: Mapping[str, dict], tenants: Sequence[str]) -> Table:
    """One row per tenant; per policy its TTFT p50/p99, SLA attainment and output tokens."""
    table = Table(title="fairlane demo: the same load under each dispatch policy")
    table.add_column("tenant")
    table.add_column("class")
    for policy in reports:
        for col in ("TTFT p50/p99 ms", "SLA met", "out tok"):
            table.add_column(f"{policy}\n{col}", justify="right")
    for tenant_id in tenants:
        row: list[str] = [tenant_id, ""]
        for report in reports.values():
            g = _tenant(report, tenant_id)
            if g is None:
                row += ["-", "-", "0"]
                continue
            row[1] = g["sla_class"]
            row += [
                f"{_ms(g['ttft_s']['p50'])}/{_ms(g['ttft_s']['p99'])}",
                _pct(g["sla_attainment"]),
                str(g["output_tokens"]),
            ]
        table.add_row(*row)
    return table


def _output_tokens(report: dict, tenant_id: str) -> int:
    g = _tenant(report, tenant_id)
    return 0 if g is None else int(g["output_tokens"])


def verdict(fcfs: dict, fair: dict, quiet: Sequence[str], noisy: str) -> str:
    """One sentence on what the difference means, from the numbers (honest when they disagree)."""
    a, b = quiet_figures(fcfs, quiet), quiet_figures(fair, quiet)
    if a.ttft_p99_s is None or b.ttft_p99_s is None:
        return "The quiet tenants finished no request in one of the runs: no comparison to make."
    noisy_share = _output_tokens(fair, noisy) / max(1, _output_tokens(fcfs, noisy))
    names = " and ".join(quiet)
    if b.ttft_p99_s < a.ttft_p99_s:
        return (
            f"Under fcfs {names} wait behind {noisy}'s queue (TTFT p99 {_ms(a.ttft_p99_s)} ms, SLA met "
            f"{_pct(a.sla_attainment)}); under fairlane their interactive tier goes first, on room kept "
            f"free for tenants holding little (TTFT p99 {_ms(b.ttft_p99_s)} ms, SLA met "
            f"{_pct(b.sla_attainment)}), while {noisy} still gets {noisy_share:.0%} of the tokens it "
            "got under fcfs."
        )
    return (
        f"On this run fairlane did not shorten {names}'s TTFT p99 ({_ms(b.ttft_p99_s)} ms vs "
        f"{_ms(a.ttft_p99_s)} ms under fcfs): the machine may be too busy for the demo's timing."
    )


def print_comparison(reports: Mapping[str, dict], quiet: Sequence[str], noisy: str, console: Console) -> None:
    console.print(side_by_side(reports, [*quiet, noisy]))
    console.print(verdict(reports["fcfs"], reports["fairlane"], quiet, noisy))
