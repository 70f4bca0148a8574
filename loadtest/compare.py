"""Two runs side by side: per-tenant latency and attainment, fairness and cost, with B/A ratios."""

from __future__ import annotations

from loadtest.tables import ms, num, pct


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a, None when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return b / a


def compare_rows(a: dict, b: dict) -> list[tuple[str, str, str, str]]:
    """(measure, A, B, B/A) for every tenant present in both runs, then fairness and cost."""
    rows: list[tuple[str, str, str, str]] = []
    for tid in sorted(set(a["tenants"]) & set(b["tenants"])):
        ga, gb = a["tenants"][tid], b["tenants"][tid]
        for key, label in (("p50", "TTFT p50 ms"), ("p99", "TTFT p99 ms")):
            va, vb = ga["ttft_s"][key], gb["ttft_s"][key]
            rows.append((f"{tid}: {label}", ms(va), ms(vb), num(ratio(va, vb))))
        rows.append(
            (
                f"{tid}: SLA attainment",
                pct(ga["sla_attainment"]),
                pct(gb["sla_attainment"]),
                num(ratio(ga["sla_attainment"], gb["sla_attainment"])),
            )
        )
        rows.append(
            (f"{tid}: ok / requests", f"{ga['ok']}/{ga['requests']}", f"{gb['ok']}/{gb['requests']}", "")
        )
    fa, fb = a["fairness"], b["fairness"]
    for key, label, fmt in (
        ("max_service_gap", "max service gap (weighted tok/window)", "{:.0f}"),
        ("jain_backlogged_mean", "Jain, same class & weight, backlogged", "{:.3f}"),
        ("jain_overall", "Jain, whole run", "{:.3f}"),
    ):
        rows.append((label, num(fa[key], fmt), num(fb[key], fmt), num(ratio(fa[key], fb[key]))))
    for key, label in (("output_throughput_tps", "output tok/s"), ("goodput_rps", "goodput r/s")):
        va, vb = a["overall"][key], b["overall"][key]
        rows.append((label, num(va), num(vb), num(ratio(va, vb))))
    ca, cb = a["cost"]["dollars_per_success"], b["cost"]["dollars_per_success"]
    rows.append(("$ per successful response", num(ca, "{:.6f}"), num(cb, "{:.6f}"), num(ratio(ca, cb))))
    return rows


def quiet_ttft_p99_ratio(a: dict, b: dict, noisy: str | None = None) -> dict[str, float | None]:
    """p99 TTFT of run B over run A for every tenant except the noisy one (the one sending most)."""
    noisy = noisy or max(a["tenants"], key=lambda t: a["tenants"][t]["requests"])
    return {
        t: ratio(a["tenants"][t]["ttft_s"]["p99"], b["tenants"][t]["ttft_s"]["p99"])
        for t in sorted(set(a["tenants"]) & set(b["tenants"]))
        if t != noisy
    }
