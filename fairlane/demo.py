"""``fairlane demo``: the same seeded load under ``fcfs`` and under ``fairlane``, side by side.

One local Ray and Serve for both runs: the app is deployed with ``dispatch_policy=fcfs``, the load
runs, then the app is redeployed under the same name with ``dispatch_policy=fairlane`` and the same
load runs again. The tenancy file (``tenancy/demo_cpu_tenants.yaml``) has SLA targets sized for
SmolLM2 on a CPU, so the quiet tenants can meet them when the router lets them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from cluster.config import AppConfig
from cluster.ops.local_cluster import local_cluster, redeploy, short_router_drain_window
from fairlane.demo_load import DemoLoad, LoadResult, run_load
from fairlane.demo_report import print_comparison, quiet_figures, sla_table

DEMO_TENANCY = Path(__file__).resolve().parents[1] / "tenancy" / "demo_cpu_tenants.yaml"
POLICIES = ("fcfs", "fairlane")
QUIET = ("alice", "dave")
NOISY = "carol"
# Room for eight requests on the replica: the fairlane dispatcher keeps two of them for tenants
# holding little (a quarter), so both quiet tenants fit while carol holds the other six.
DEMO_ROOM = 8


def demo_config(port: int, policy: str) -> AppConfig:
    """The embedded default on a small CPU box (SmolLM2 on CPU), with the demo's tenants."""
    return AppConfig.model_validate(
        {
            "engine": {"device": "cpu", "kv_cache_tokens": 8192},
            "replica_room": DEMO_ROOM,
            "port": port,
            "tenancy_config": str(DEMO_TENANCY),
            "dispatch_policy": policy,
            "ledger": False,  # each run's report from the router's memory, reset at its start
            "drain_timeout_s": 10.0,
        }
    )


@dataclass(frozen=True, slots=True)
class DemoResult:
    reports: dict[str, dict]  # dispatch policy -> the run's admin SLA report
    lone_ttft_s: dict[str, float]  # dispatch policy -> a lone request's TTFT before its run

    def quiet_ttft_p99_s(self, policy: str) -> float | None:
        return quiet_figures(self.reports[policy], QUIET).ttft_p99_s


def run_demo(load: DemoLoad, port: int, console: Console) -> DemoResult:
    """Both runs on one cluster; prints each run's table as it ends, then the comparison."""
    reports: dict[str, dict] = {}
    lone: dict[str, float] = {}
    first = demo_config(port, POLICIES[0])
    model = first.served_model_name
    _quiet_serve_logs()
    # The demo's only load balancer is its own HAProxy, and no request is sent while the redeploy
    # waits for the first run's router to stop: 30 s of the demo's ~100 s went to that wait.
    short_router_drain_window()
    with local_cluster(first) as base_url:
        console.print(f"cluster up at {base_url} (SmolLM2 on CPU, one replica, room for {DEMO_ROOM})")
        for policy in POLICIES:
            if policy != POLICIES[0]:
                console.print(f"redeploying with dispatch_policy={policy} ...")
                base_url = redeploy(demo_config(port, policy))
            console.print(f"dispatch_policy={policy}: {_load_line(load)}")
            result: LoadResult = asyncio.run(run_load(base_url, model, load))
            reports[policy], lone[policy] = result.report, result.lone_ttft_s
            console.print(sla_table(result.report, f"dispatch_policy={policy}: {load.duration_s:.0f}s"))
    console.print(
        f"a lone request's TTFT on this machine: {lone[POLICIES[-1]] * 1000:.0f} ms; interactive TTFT "
        f"target: {_interactive_target_s():.2f} s ({DEMO_TENANCY.name})"
    )
    print_comparison(reports, QUIET, NOISY, console)
    return DemoResult(reports, lone)


def _quiet_serve_logs() -> None:
    """Serve's INFO lines on the driver (starting, connecting, app ready) say what the demo's own
    lines say; warnings and errors still show."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)


def _load_line(load: DemoLoad) -> str:
    parts = [
        f"{t.tenant} x{t.concurrency}{' (noisy)' if not t.quiet else ''}, {t.max_tokens} tokens"
        for t in load.tenants
    ]
    return f"{'; '.join(parts)}; {load.duration_s:.0f}s"


def _interactive_target_s() -> float:
    from tenancy.loader import load_tenancy_config

    config = load_tenancy_config(DEMO_TENANCY)
    return next(c.ttft_target_s for c in config.sla_classes if c.name == "interactive")


def write_json(result: DemoResult, load: DemoLoad, path: Path) -> None:
    """The two reports and the load, for scripts and the demo's test."""
    body = {
        "load": asdict(load),
        "lone_ttft_s": result.lone_ttft_s,
        "quiet_ttft_p99_s": {p: result.quiet_ttft_p99_s(p) for p in POLICIES},
        "reports": result.reports,
    }
    path.write_text(json.dumps(body, indent=2), encoding="utf-8")
