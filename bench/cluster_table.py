"""The one table of the cluster benchmark (``bench.cluster_run``'s results.json)."""

from __future__ import annotations

from rich.table import Table

from loadtest.tables import dur, num, pct


def _tps(v: float | None) -> str:
    return num(v, "{:,.1f}")


def one_capacity(label: str, cap: dict) -> list[tuple[str, str]]:
    if "source" in cap:
        return [(label, f"{_tps(cap['capacity_output_tps'])} out tok/s ({cap['source']})")]
    if "steps" not in cap:
        return [(label, cap.get("skipped", "not measured"))]
    steps = cap["steps"]
    ladder = " → ".join(f"{s['offered_rps']:.1f}: {s['achieved_tps']:,.0f}" for s in steps)
    bound = "" if cap["saturated"] else " (not saturated: a lower bound)"
    value = f"{_tps(cap['capacity_rps'])} req/s, {_tps(cap['capacity_output_tps'])} out tok/s{bound}"
    rule = cap.get("rule", {})
    return [
        (f"{label} ({rule.get('scenario', 'steady')}, tok/s by {rule.get('throughput', 'span')})", value),
        ("  sweep: offered req/s: achieved out tok/s", ladder),
        ("  saturation", cap["reason"] or "none within the ladder"),
        ("  load generator CPU (max of rungs)", num(max((s["client_cpu"] for s in steps), default=None))),
    ]


def scaling_row(results: dict) -> tuple[str, str]:
    sf = results.get("scaling_factor")
    planned = results.get("plan", {}).get("replicas") or [1]
    if sf:
        n0, n1 = sf["from_replicas"], sf["to_replicas"]
        bound = "" if sf["both_saturated"] else ", not both saturated: rough"
        value = f"{sf['factor']:.2f}× (ideal {sf['ideal']:g}×, issue target ≥ 1.9× for 2{bound})"
        return (f"scaling factor, {n1} replicas / {n0}", value)
    if len(planned) < 2:
        return ("capacity, 2 replicas / scaling factor", "not run (one replica count; --replicas 1,2)")
    return ("scaling factor", "not measured (a count's sweep did not run)")


def capacity_rows(results: dict) -> list[tuple[str, str]]:
    by = results.get("capacity_by_replicas")
    if by is None:  # results.json of a run before --replicas: one replica, one capacity
        old = results.get("capacity")
        rows = one_capacity("capacity, 1 replica", old) if old else [("capacity, 1 replica", "not measured")]
        return [
            *rows,
            ("capacity, 2 replicas / scaling factor", results.get("two_replicas", "blocked: one GPU lent")),
        ]
    rows = []
    routers = results.get("routers_by_replicas", {})
    for n, cap in sorted(by.items(), key=lambda kv: int(kv[0])):
        label = f"capacity, {n} replica{'s' if n != '1' else ''}"
        if routers.get(n):
            label += f", {routers[n]} router{'s' if routers[n] != 1 else ''}"
        rows += one_capacity(label, cap)
    return [*(rows or [("capacity", "not measured")]), scaling_row(results)]


def overhead_rows(results: dict) -> list[tuple[str, str]]:
    c = results.get("serve_vs_engine")
    if not c:  # the engine alone or the cluster failed first
        return [("Serve path vs engine alone", "not measured")]
    shares = f"{pct(c['engine_output_share'])}, {pct(c['serve_output_share'])}"
    earlier = (
        "" if c.get("engine_source", "measured in this run") == "measured in this run" else " (earlier run)"
    )
    return [
        (
            f"engine alone, closed loop of {c['concurrency']}{earlier}",
            f"{_tps(c['engine_output_tps'])} out tok/s",
        ),
        (f"Serve path, same {c['concurrency']} requests' shape", f"{_tps(c['serve_output_tps'])} out tok/s"),
        ("  throughput ratio Serve / engine", num(c["throughput_ratio"], "{:.3f}")),
        ("  TTFT p50 engine → Serve", f"{dur(c['engine_ttft_p50_s'])} → {dur(c['serve_ttft_p50_s'])}"),
        ("  TPOT p50 engine → Serve", f"{dur(c['engine_tpot_p50_s'])} → {dur(c['serve_tpot_p50_s'])}"),
        ("  output / max_tokens engine, Serve", shares),
    ]


def scenario_rows(name: str, run: dict) -> list[tuple[str, str]]:
    if "summary" not in run:
        return [(name, run.get("skipped", "not run"))]
    s = run["summary"]
    o, f, c = s["overall"], s["fairness"], s["cost"]
    rows = [
        (
            f"{name} at ×{run['load_factor']:g} capacity (scale {run['scale']:.3g})",
            f"{_tps(o['request_throughput_rps'])} req/s ok, {_tps(o['output_throughput_tps'])} out tok/s",
        )
    ]
    for tid, g in s["tenants"].items():
        rows.append(
            (
                f"  {tid} ({g['sla_class']}) TTFT p99 / TPOT p99 / SLA met",
                f"{dur(g['ttft_s']['p99'])} / {dur(g['tpot_s']['p99'])} / {pct(g['sla_attainment'])}"
                f"  (ok {g['ok']}, 429 {g['rejected']}, failed {g['failed']})",
            )
        )
    classes = ", ".join(f"{k} {pct(v['sla_attainment'])}" for k, v in s["classes"].items())
    rows += [
        ("  SLA attainment per class", classes),
        ("  max service gap (weighted tok/s)", num(f["max_service_gap_rate"], "{:.1f}")),
        (
            "  Jain index (backlogged windows / whole run)",
            f"{num(f['jain_backlogged_mean'], '{:.3f}')} / {num(f['jain_overall'], '{:.3f}')}",
        ),
        ("  dollars per successful response", num(c["dollars_per_success"], "{:.7f}")),
        ("  output / max_tokens (below 100 %: EOS)", pct(run.get("output_share"))),
    ]
    return rows


def bench_table(results: dict) -> Table:
    """Capacity, Serve overhead, then each scenario: per-tenant latency and SLA, fairness, cost."""
    table = Table(title=f"fairlane cluster benchmark: {results.get('title', '')}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for rows in (
        capacity_rows(results),
        overhead_rows(results),
        *(scenario_rows(n, r) for n, r in results.get("scenarios", {}).items()),
    ):
        for i, row in enumerate(rows):
            table.add_row(*row, end_section=i == len(rows) - 1)
    if results.get("error"):
        table.add_row("ERROR", results["error"].strip().splitlines()[-1])
    return table
