"""``fairlane chaos``: the fault drills against a running cluster, with the accounting table.

    fairlane chaos overload --url http://127.0.0.1:8000
    fairlane chaos storm --url ...
    fairlane chaos crash --url ... --ray-address auto --app fairlane
    fairlane chaos redis --url ... --redis-down "systemctl stop redis" --redis-up "systemctl start redis" \
        --metered-key sk-... --metered-rpm 30 --routers 2
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cluster.ops.chaos_drills import DrillReport, Fault, Target, disconnect_storm, overload, replica_crash
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS

chaos_app = typer.Typer(help="Fault drills against a running cluster (prints the accounting table).")
console = Console(width=160)
URL = typer.Option("http://127.0.0.1:8000", "--url", help="The cluster's base URL.")
KEYS = typer.Option(None, "--key", help="tenant=key, repeatable (default: the demo tenants).")
ADMIN = typer.Option(DEMO_ADMIN_KEY, "--admin-key", help="Admin key (reads /admin/state).")
ROUTERS = typer.Option(1, "--routers", help="Router replicas (each one's counters are read).")
JSON_OUT = typer.Option(None, "--json", help="Append the report as one JSON line to this file.")


def _target(url: str, keys: list[str] | None, admin: str, routers: int) -> Target:
    pairs = dict(k.split("=", 1) for k in keys) if keys else {t: DEMO_KEYS[t] for t in sorted(DEMO_KEYS)}
    return Target(url, pairs, admin, routers=routers)


def shell_fault(cmd: str) -> Fault:
    """An operator's shell command as a drill's fault (a coroutine function; fails on a non-zero exit)."""

    async def run() -> None:
        await asyncio.to_thread(subprocess.run, cmd, shell=True, check=True)

    return run


def show(report: DrillReport, json_out: Path | None = None) -> None:
    """The accounting table (client vs server) and the drill's figures."""
    table = Table(title=f"{report.name}: {'balanced' if report.balanced else 'NOT BALANCED'}")
    for col in ("side", "sent", "completed", "rejected", "errored", "aborted"):
        table.add_column(col, justify="left" if col == "side" else "right")
    for side, counts in (("client", report.client), ("server", report.server)):
        table.add_row(
            side, *(str(counts.get(k, "")) for k in ("sent", "completed", "rejected", "errored", "aborted"))
        )
    console.print(table)
    console.print(", ".join(f"{k}={v}" for k, v in report.figures.items()))
    if report.left_as_answered > 0:  # allowed by ``balanced``, but worth seeing: how often clients raced
        console.print(
            f"client aborts the server had answered (left as the answer came): {report.left_as_answered}"
        )
    if json_out is not None:
        with json_out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(report.to_dict()) + "\n")
    if not report.balanced:
        raise typer.Exit(1)


@chaos_app.command("overload")
def overload_cmd(
    url: str = URL,
    key: list[str] = KEYS,
    admin_key: str = ADMIN,
    routers: int = ROUTERS,
    factor: float = typer.Option(5.0, help="Offered load / measured capacity."),
    phase_s: float = typer.Option(10.0, "--phase-s", help="Seconds per phase (two phases)."),
    json_out: Path | None = JSON_OUT,
) -> None:
    """Two equal phases at FACTOR x capacity: 429s beyond the queue bounds, memory before/after."""
    show(asyncio.run(overload(_target(url, key, admin_key, routers), factor, phase_s)), json_out)


@chaos_app.command("storm")
def storm_cmd(
    url: str = URL,
    key: list[str] = KEYS,
    admin_key: str = ADMIN,
    routers: int = ROUTERS,
    clients: int = typer.Option(100, help="Streaming clients that drop at random points."),
    json_out: Path | None = JSON_OUT,
) -> None:
    """Disconnect storm: everything held must come back."""
    show(asyncio.run(disconnect_storm(_target(url, key, admin_key, routers), clients)), json_out)


@chaos_app.command("crash")
def crash_cmd(
    url: str = URL,
    key: list[str] = KEYS,
    admin_key: str = ADMIN,
    routers: int = ROUTERS,
    ray_address: str = typer.Option("auto", "--ray-address", help="Ray cluster to reach the replicas."),
    app_name: str = typer.Option("fairlane", "--app", help="Serve application name."),
    json_out: Path | None = JSON_OUT,
) -> None:
    """Kill one replica actor under steady load; retried / failed / completed and time to recover."""
    import ray

    from cluster.ops.chaos_ray import ReplicaKiller

    ray.init(address=ray_address, namespace="serve", log_to_driver=False)
    killer = ReplicaKiller(app_name)
    target = _target(url, key, admin_key, routers)
    show(asyncio.run(replica_crash(target, killer.kill, killer.recovered)), json_out)


@chaos_app.command("redis")
def redis_cmd(
    url: str = URL,
    key: list[str] = KEYS,
    admin_key: str = ADMIN,
    routers: int = ROUTERS,
    redis_down: str = typer.Option(..., "--redis-down", help="Shell command that stops Redis."),
    redis_up: str = typer.Option(..., "--redis-up", help="Shell command that starts Redis again."),
    metered: str = typer.Option(..., "--metered", help="tenant=key of a tenant to push past its RPM."),
    metered_rpm: int = typer.Option(..., "--metered-rpm", help="That tenant's requests per minute."),
    json_out: Path | None = JSON_OUT,
) -> None:
    """Stop the shared Redis under load, start it again: degraded, reconnect, quota kept."""
    from cluster.ops.chaos_redis import redis_outage

    tenant, tenant_key = metered.split("=", 1)
    down, up = shell_fault(redis_down), shell_fault(redis_up)
    target = _target(url, key, admin_key, routers)
    show(asyncio.run(redis_outage(target, down, up, (tenant, tenant_key, metered_rpm))), json_out)


@chaos_app.command("soak")
def soak_cmd(
    url: str = URL,
    key: list[str] = KEYS,
    admin_key: str = ADMIN,
    routers: int = ROUTERS,
    duration_s: float = typer.Option(1800.0, "--duration-s", help="Length of the run."),
    max_requests: int = typer.Option(200_000, "--max-requests", help="Or stop after this many requests."),
    cycle_s: float = typer.Option(60.0, "--cycle-s", help="Seconds between two faults."),
    window_s: float = typer.Option(600.0, "--window-s", help="Memory windows: first and last this long."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster: replica kills."),
    app_name: str = typer.Option("fairlane", "--app", help="Serve application name (replica kills)."),
    redis_down: str | None = typer.Option(None, "--redis-down", help="Shell command that stops Redis."),
    redis_up: str | None = typer.Option(None, "--redis-up", help="Shell command that starts Redis again."),
    serve_config: Path | None = typer.Option(
        None, "--serve-config", help="Start the cluster here first (local Ray) with this app config."
    ),
    json_out: Path | None = JSON_OUT,
) -> None:
    """A long mixed run with storms, bursts, replica kills and Redis restarts: 0 lost, 0 hung,
    balanced books, flat memory, and everything held back at its baseline at the end.

    With --serve-config the cluster runs in this process (replica kills need no --ray-address)."""
    if serve_config is not None:
        from cluster.config import load_app_config
        from cluster.ops.local_cluster import APP_NAME, local_cluster

        cfg = load_app_config(serve_config, {})
        with local_cluster(cfg) as base_url:
            _soak(base_url, key, admin_key, cfg.num_routers, duration_s, max_requests, cycle_s, window_s,
                  APP_NAME, redis_down, redis_up, json_out, in_ray=True)  # fmt: skip
        return
    if ray_address is not None:
        import ray

        ray.init(address=ray_address, namespace="serve", log_to_driver=False)
    _soak(url, key, admin_key, routers, duration_s, max_requests, cycle_s, window_s,
          app_name, redis_down, redis_up, json_out, in_ray=ray_address is not None)  # fmt: skip


def _soak(
    url: str,
    key: list[str] | None,
    admin_key: str,
    routers: int,
    duration_s: float,
    max_requests: int,
    cycle_s: float,
    window_s: float,
    app_name: str,
    redis_down: str | None,
    redis_up: str | None,
    json_out: Path | None,
    in_ray: bool,
) -> None:
    from cluster.ops.chaos_soak import SoakFaults, SoakPlan, soak, targets_met

    faults = SoakFaults()
    if in_ray:
        from cluster.ops.chaos_ray import ReplicaKiller

        killer = ReplicaKiller(app_name)
        faults = SoakFaults(kill_replica=killer.kill, replica_recovered=killer.recovered)
    if redis_down and redis_up:
        faults = SoakFaults(
            faults.kill_replica, faults.replica_recovered, shell_fault(redis_down), shell_fault(redis_up)
        )
    plan = SoakPlan(duration_s=duration_s, max_requests=max_requests, cycle_s=cycle_s, window_s=window_s)
    report = asyncio.run(soak(_target(url, key, admin_key, routers), faults, plan))
    show(report, json_out)
    missed = targets_met(report)
    if missed:
        console.print("targets missed: " + "; ".join(missed))
        raise typer.Exit(1)
