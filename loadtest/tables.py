"""Rich terminal tables of one run's summary and of two runs compared."""

from __future__ import annotations

from rich.table import Table


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def dur(v: float | None) -> str:
    """Compact latency: '470ms' below a second, '24.7s' above (keeps wide tables readable)."""
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if v < 1.0 else f"{v:.1f}s"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def outcomes(g: dict) -> str:
    """ok/429/err/cut: cut = ended by the client's own deadline, in no attainment (summaries written
    before the drain counted those among the errors and have no ``cut``)."""
    return f"{g['ok']}/{g['rejected']}/{g['failed']}/{g.get('cut', 0)}"


TENANT_COLUMNS = (
    "tenant",
    "class",
    "req",
    "ok/429/err/cut",
    "TTFT p50/p90/p99",
    "TPOT p50/p99",
    "ITL p50",
    "E2E p99",
    "out tok/s",
    "goodput r/s",
    "SLA met",
    "$/success",
)


def _row(name: str, cls: str, g: dict, dollars: float | None) -> list[str]:
    t, p = g["ttft_s"], g["tpot_s"]
    return [
        name,
        cls,
        str(g["requests"]),
        outcomes(g),
        f"{dur(t['p50'])}/{dur(t['p90'])}/{dur(t['p99'])}",
        f"{dur(p['p50'])}/{dur(p['p99'])}",
        dur(g["itl_s"]["p50"]),
        dur(g["e2e_s"]["p99"]),
        num(g["output_throughput_tps"], "{:.1f}"),
        num(g["goodput_rps"]),
        pct(g["sla_attainment"]),
        num(dollars, "{:.6f}"),
    ]


def summary_table(summary: dict, title: str | None = None) -> Table:
    """One row per tenant, one per class, then overall."""
    meta = summary["meta"]
    table = Table(
        title=title
        or f"{meta['scenario']}: {summary['requests_measured']} measured requests over "
        f"{summary['window_s']:.0f}s ({summary['requests_warmup']} warm-up left out)"
    )
    for col in TENANT_COLUMNS:
        table.add_column(col, justify="left" if col in ("tenant", "class") else "right")
    per = summary["cost"]["dollars_per_success_by_tenant"]
    for tid, g in summary["tenants"].items():
        table.add_row(*_row(tid, g["sla_class"], g, per.get(tid)))
    for name, g in summary["classes"].items():
        table.add_row(*_row("(class)", name, g, None), style="dim")
    table.add_row(*_row("ALL", "", summary["overall"], summary["cost"]["dollars_per_success"]), style="bold")
    return table


def fairness_table(summary: dict) -> Table:
    f, c = summary["fairness"], summary["cost"]
    table = Table(title="fairness and cost")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("window (s)", num(f["window_s"], "{:.1f}")),
        ("windows × groups with ≥2 backlogged tenants", str(f["windows_compared"])),
        ("max gap, same class & weight (weighted tokens / window)", num(f["max_service_gap"], "{:.0f}")),
        ("max service gap (weighted tokens / s)", num(f["max_service_gap_rate"], "{:.1f}")),
        ("Jain index, same class & weight, backlogged (mean)", num(f["jain_backlogged_mean"], "{:.3f}")),
        ("Jain index, same class & weight, backlogged (min)", num(f.get("jain_backlogged_min"), "{:.3f}")),
        ("Jain index, whole run", num(f["jain_overall"], "{:.3f}")),
        ("replica-seconds", num(c["replica_seconds"], "{:.1f}")),
        ("GPU dollars", num(c["dollars"], "{:.5f}")),
        ("dollars per successful response", num(c["dollars_per_success"], "{:.6f}")),
        ("errors", ", ".join(f"{k}: {v}" for k, v in summary["errors"].items()) or "none"),
        ("cut by the client's deadline (in no attainment)", str(summary["overall"].get("cut", "-"))),
        ("drain after the load (s waited / bound)", drain_text(summary["meta"].get("drain"))),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def drain_text(drain: dict | None) -> str:
    if not drain:
        return "-"
    return f"{drain['waited_s']:.1f} / {drain['seconds']:.1f}" + (" (capped)" if drain.get("capped") else "")


def share_table(summary: dict) -> Table | None:
    """Per class: attainment of its tenants within their max-min fair share and of those over it."""
    split, by_share = summary.get("fair_share"), summary.get("attainment_by_share")
    if not split or not by_share:  # a summary written before the split existed
        return None
    cap = split.get("capacity_output_tps")
    table = Table(
        title=f"within / over fair share (capacity {num(cap, '{:,.1f}')} out tok/s: "
        f"{split.get('capacity_source', '-')}; offered {num(split.get('offered_over_capacity'))}× it)"
    )
    columns = ("class", "share", "tenants", "req", "ok/429/err/cut", "TTFT p99", "TTFT met", "TPOT met",
               "SLA met", "cut")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("class", "share", "tenants") else "right")
    for cls, sides in by_share.items():
        for side, g in sides.items():
            table.add_row(
                cls,
                side,
                ", ".join(g["tenants"]),
                str(g["requests"]),
                outcomes(g),
                dur(g["ttft_s"]["p99"]),
                pct(g.get("ttft_attainment")),
                pct(g.get("tpot_attainment")),
                pct(g["sla_attainment"]),
                str(g.get("cut", "-")),
            )
    return table


def compare_table(rows: list[tuple[str, str, str, str]], labels: tuple[str, str]) -> Table:
    table = Table(title=f"{labels[0]} vs {labels[1]}")
    for col in ("measure", labels[0], labels[1], f"{labels[1]} / {labels[0]}"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for row in rows:
        table.add_row(*row)
    return table
