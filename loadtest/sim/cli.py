"""The body of ``fairlane simulate`` (fairlane/cli.py holds only the typer signature)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from loadtest.sim.autoscale_day import DaySpec, run_day
from loadtest.sim.output import _json_default
from loadtest.sim.runner import find_scenario, run_simulation
from loadtest.sim.spec import AutoscalingSpec, SimSpec


@dataclass(frozen=True, slots=True)
class RouterOptions:
    """Several routers: how many, their counter exchange period (None: the cluster's), which one a
    request reaches (``loadtest/sim/multi_router.py``)."""

    routers: int = 1
    counter_sync_s: float | None = None
    router_choice: str = "power_of_two"
    share_lifts: bool = False

    def cluster_fields(self) -> dict:
        fields = {
            "routers": self.routers,
            "router_choice": self.router_choice,
            "share_lifts": self.share_lifts,
        }
        return fields if self.counter_sync_s is None else fields | {"counter_sync_s": self.counter_sync_s}


def build_spec(
    tenants: int,
    replicas: int,
    requests: int,
    policies: str,
    load_factor: float,
    step_model: str,
    autoscale_max: int | None,
    write_records: bool,
    seed: int | None,
    routers: RouterOptions = RouterOptions(),
) -> SimSpec:
    autoscaling = None
    if autoscale_max is not None:
        autoscaling = AutoscalingSpec(min_replicas=1, max_replicas=autoscale_max, initial_replicas=replicas)
    return SimSpec.model_validate(
        {
            "scale": {"tenants": tenants, "requests": requests, "load_factor": load_factor, "seed": seed},
            "cluster": {"replicas": replicas, "step_model": step_model, "autoscaling": autoscaling}
            | routers.cluster_fields(),
            "policies": tuple(p.strip() for p in policies.split(",") if p.strip()),
            "write_records": write_records,
        }
    )


def run_cli(scenario: str, spec: SimSpec, out: Path, console: Console) -> dict:
    report = run_simulation(find_scenario(scenario), spec, out, progress=console.print)
    console.print(comparison_table(report))
    console.print(f"results: {out} (comparison.json; per policy: sim_summary.json, records.jsonl)")
    return report


def comparison_table(report: dict) -> Table:
    table = Table(
        title=f"{report['scenario']}: {report['requests']} requests, {report['tenants']} tenants, "
        f"{report['spec']['cluster']['replicas']} replicas{_routers(report['spec']['cluster'])}"
        f" ({report['simulated_s']:.0f} s simulated)"
    )
    cols = (
        "policy",
        "ok req/s",
        "interactive TTFT att.",
        "within share",
        "batch att.",
        "max gap (w-tokens)",
        "Jain (mean / min)",
        "$ / success",
        "wall s",
    )
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    for name, s in report["policies"].items():
        cls = s["classes"]
        table.add_row(
            name,
            f"{s['throughput_rps']:.1f}",
            _pct(cls.get("interactive", {}).get("ttft_attainment")),
            _pct(cls.get("interactive", {}).get("ttft_attainment_within_share")),
            _pct(cls.get("batch", {}).get("attainment")),
            _num(s["fairness"]["max_service_gap"]),
            f"{_num(s['fairness']['jain'], '.3f')} / {_num(s['fairness'].get('jain_min'), '.3f')}",
            f"{s['dollars_per_success']:.6f}",
            f"{s['wall_s']:.1f}",
        )
    return table


def _routers(cluster: dict) -> str:
    n = cluster.get("routers", 1)
    return "" if n == 1 else f", {n} routers (counters synced every {cluster['counter_sync_s']:g} s)"


def _pct(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else f"{100 * x:{fmt}}%"


def _num(x: float | None, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def run_autoscale_cli(spec: DaySpec, out: Path, console: Console) -> dict:
    """``fairlane simulate-autoscale``: the day of ``autoscale_day.py``, every policy, one JSON."""
    report = run_day(spec, progress=console.print)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=_json_default))
    table = Table(title=f"autoscaling a day: {report['requests']} requests, {report['tenants']} tenants, "
                  f"bound {spec.bound} ({spec.step_model})")  # fmt: skip
    cols = ("policy", "interactive (within share)", "standard (within share)", "replica-h", "$ / success",
            "peak", "wall s")  # fmt: skip
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    for name, s in report["policies"].items():
        table.add_row(
            name, _pct(s["interactive_within_share"], ".2f"), _pct(s["standard_within_share"], ".2f"),
            f"{s['replica_hours']:.2f}", f"{s['dollars_per_success']:.7f}", str(s["peak_replicas"]),
            f"{s['wall_s']:.1f}",
        )  # fmt: skip
    console.print(table)
    c = report["claims"]
    console.print(f"sla / {c['reference_count_policy']}: {c['replica_hours_ratio']:.2f}× the replica-hours; "
                  f"target met: {c['target_met']}; results: {out}")  # fmt: skip
    return report
