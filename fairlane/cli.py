"""The ``fairlane`` command: serve, demo, profile (and ``bench``, added by the benchmarks owner)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import typer
from ray import serve
from rich.console import Console
from rich.table import Table

from cluster.config import AppConfig, load_app_config
from cluster.drain import StopSignal
from cluster.ops.direct_ingress import router_urls
from cluster.ops.edge import HAPROXY_VAR
from cluster.ops.engine_report import sizes_lines
from cluster.ops.local_cluster import APP_NAME, free_port, local_cluster
from fairlane.bench_cli import bench_app
from fairlane.chaos_cli import chaos_app
from tenancy import DEMO_KEYS, DISPATCH_POLICIES

app = typer.Typer(help="fairlane: multi-tenant LLM serving on Ray Serve.", no_args_is_help=True)
console = Console(width=160)  # tables stay readable when piped

app.add_typer(bench_app, name="bench")
app.add_typer(chaos_app, name="chaos")


def _cpu_demo_config(port: int) -> AppConfig:
    """The embedded default on a small CPU box: SmolLM2 on CPU, four requests in flight per replica."""
    return AppConfig.model_validate(
        {"engine": {"device": "cpu", "kv_cache_tokens": 8192}, "replica_room": 4, "port": port}
    )


@app.command("serve")
def serve_cmd(
    config: Path | None = typer.Option(None, "--config", help="App config YAML (cluster.config.AppConfig)."),
    address: str | None = typer.Option(None, "--address", help="Ray address to join; default: start one."),
    port: int | None = typer.Option(None, "--port", help="HTTP port (overrides the config)."),
    model: str | None = typer.Option(
        None, "--model", help="A Hugging Face checkpoint directory or a preset (overrides the config)."
    ),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="The model's name in the API; default: the directory's name."
    ),
    replica_choice: str | None = typer.Option(
        None,
        "--replica-choice",
        help="prefix (default: prefer the replica caching the prompt's prefix) or load (load alone).",
    ),
    dispatch_policy: str | None = typer.Option(
        None,
        "--dispatch-policy",
        help="fairlane (default: fair share within SLA tiers), vtc (fair share, one tier) or fcfs "
        "(arrival order).",
    ),
    edge: str | None = typer.Option(
        None,
        "--edge",
        help="How clients reach the routers at the port: haproxy (default: an HAProxy balances over "
        "the routers' own ports, no Python in between) or proxy (Serve's HTTP proxy).",
    ),
    direct_ingress: bool = typer.Option(
        False,
        "--direct-ingress",
        help="With --edge proxy: each router also serves HTTP on a port of its own (30000 up), "
        "skipping the proxy. Prints the routers' URLs.",
    ),
) -> None:
    """Run the cluster until interrupted (default: local Ray, in-memory quotas, SmolLM2, port 8000)."""
    overrides: dict = {} if port is None else {"port": port}
    if replica_choice is not None:
        if replica_choice not in ("load", "prefix"):
            raise typer.BadParameter("--replica-choice is load or prefix")
        overrides["replica_choice"] = replica_choice
    if dispatch_policy is not None:
        if dispatch_policy not in DISPATCH_POLICIES:
            raise typer.BadParameter(f"--dispatch-policy is one of {', '.join(DISPATCH_POLICIES)}")
        overrides["dispatch_policy"] = dispatch_policy
    if edge is not None:
        if edge not in ("haproxy", "proxy"):
            raise typer.BadParameter("--edge is haproxy or proxy")
        overrides["edge"] = edge
    if direct_ingress:
        overrides["direct_ingress"] = True
    cfg = with_model(load_app_config(config, overrides), model, served_model_name)
    stop = StopSignal()
    # SIGTERM handling goes in between ray.init (which installs Ray's own, aborting handler) and
    # Serve opening the port; leaving the block drains within cfg.drain_timeout_s.
    with local_cluster(cfg, address, on_ray_up=stop.install) as base_url:
        names = ", ".join(m.name for m in cfg.served_models)
        console.print(f"fairlane serving [bold]{names}[/] at {base_url}/v1 (Ctrl-C to stop)")
        for line in sizes_lines(cfg, APP_NAME):
            console.print(line, highlight=False, soft_wrap=True)  # one line, however long
        if os.environ.get(HAPROXY_VAR) == "1":  # the edge this Ray runs (HAProxy where it can run)
            console.print(f"edge: HAProxy at port {cfg.port} over every router's own port", highlight=False)
        elif cfg.direct_ingress:
            print_router_urls(cfg)
        stop.wait()


def print_router_urls(cfg: AppConfig) -> None:
    """The routers' own URLs (direct ingress), or why there are none (a joined cluster without it)."""
    urls = router_urls(APP_NAME, cfg.host)
    for url in urls:
        console.print(f"router (direct ingress, no proxy hop) at {url}/v1")
    if not urls:
        console.print(
            "[yellow]direct ingress is off in this Ray cluster[/]: its Ray processes need "
            "RAY_SERVE_ENABLE_DIRECT_INGRESS=1 when they start; clients use the proxy URL above"
        )


def with_model(cfg: AppConfig, model: str | None, served_name: str | None) -> AppConfig:
    """The config serving `model` (a directory or a preset) under `served_name`, by default the
    model's own name (the directory's or the preset's)."""
    if model is None and served_name is None:
        return cfg
    if cfg.models:  # which entry would it change? The config's list says what each model serves.
        raise typer.BadParameter("the config lists models: --model and --served-model-name serve one model")
    data = cfg.model_dump(exclude_unset=True)
    if model is not None:
        data["engine"] = {**data.get("engine", {}), "model": model}
        data.pop("served_model_name", None)  # the model's own name, unless named below
    if served_name is not None:
        data["served_model_name"] = served_name
    return AppConfig.model_validate(data)


@app.command()
def demo(
    duration: float | None = typer.Option(None, help="Seconds of load per policy (25; 8 with --quick)."),
    quick: bool = typer.Option(False, "--quick", help="A short run (the test's): 8 s of load per policy."),
    seed: int = typer.Option(7, help="Seed of the prompts and pauses (the same for both runs)."),
    port: int | None = typer.Option(None, help="HTTP port; default: a free one."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write both reports to this file."),
) -> None:
    """Run one seeded load (carol floods, alice and dave ask quietly) under fcfs, then under
    fairlane, on the local cluster; print the quiet tenants' TTFT and SLA attainment side by side."""
    from fairlane.demo import run_demo, write_json
    from fairlane.demo_load import demo_load

    load = demo_load(duration if duration is not None else (8.0 if quick else 25.0), seed)
    result = run_demo(load, port or free_port(), console)
    if json_out is not None:
        write_json(result, load, json_out)


@app.command()
def profile(
    requests: int = typer.Option(8, help="Concurrent requests to profile."),
    max_tokens: int = typer.Option(32, help="Output tokens per request."),
) -> None:
    """Run a short load on one replica and print its step-time breakdown (engine profiler)."""
    cfg = _cpu_demo_config(free_port()).model_copy(update={"replica_room": requests})
    with local_cluster(cfg) as base_url:
        asyncio.run(_profile_load(base_url, cfg.served_model_name, requests, max_tokens))
        summary = serve.get_deployment_handle("Replica", APP_NAME).profile.remote().result(timeout_s=30)
    console.print(profile_table(summary))


async def _profile_load(base_url: str, model: str, requests: int, max_tokens: int) -> None:
    headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}
    body = {
        "model": model,
        "prompt": "Tell me about the history of Paris.",
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        await asyncio.gather(
            *[client.post("/v1/completions", json=body, headers=headers) for _ in range(requests)]
        )


def profile_table(summary: dict) -> Table:
    """Rows for each timed field (mean/p50/p99 ms) then the scalar figures."""
    table = Table(
        title=f"replica {summary.get('replica_id', '?')}: step-time breakdown ({summary.get('steps')} steps)"
    )
    for col in ("field", "mean", "p50", "p99"):
        table.add_column(col, justify="left" if col == "field" else "right")
    for name, value in summary.items():
        if isinstance(value, dict):
            table.add_row(name, *(f"{value.get(k, 0):.3f}" for k in ("mean", "p50", "p99")))
    for name, value in summary.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            table.add_row(name, f"{value:.3f}" if isinstance(value, float) else str(value), "", "")
    return table


@app.command("loadtest")
def loadtest_cmd(
    scenario: str = typer.Argument(..., help="Shipped scenario name or YAML path."),
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="OpenAI-compatible base URL."),
    out: Path = typer.Option(..., "--out", help="Folder for records.jsonl and summary.json."),
    scale: float = typer.Option(1.0, "--scale", help="Multiply every rate and concurrency."),
    duration: float | None = typer.Option(None, "--duration", help="Seconds of load (override)."),
    seed: int | None = typer.Option(None, "--seed", help="Override the scenario's seed."),
    max_requests: int | None = typer.Option(None, "--max-requests", help="Cap on requests sent."),
    replicas: int = typer.Option(1, "--replicas", help="Replicas if /health has none."),
    admin_key: str | None = typer.Option(
        None, "--admin-key", help="fairlane admin key: reset and fetch the server's SLA report and timings."
    ),
    window: float | None = typer.Option(None, "--window", help="Fairness/timeline window in seconds."),
) -> None:
    """Drive a multi-tenant scenario against URL; write raw records and a summary (see docs/loadtest.md)."""
    from loadtest.commands import run_loadtest

    run_loadtest(
        scenario,
        url,
        out,
        scale=scale,
        duration_s=duration,
        seed=seed,
        max_requests=max_requests,
        replicas=replicas,
        admin_key=admin_key,
        window_s=window,
        console=console,
    )


@app.command("capacity")
def capacity_cmd(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="OpenAI-compatible base URL."),
    out: Path = typer.Option(..., "--out", help="Folder: capacity.json and one run folder per rung."),
    scenario: str = typer.Option("steady", "--scenario", help="Scenario whose rates the ladder scales."),
    model: str | None = typer.Option(None, "--model", help="Model name sent (default: the scenario's)."),
    start_scale: float = typer.Option(1.0, "--start-scale", help="Scale of the first rung."),
    factor: float = typer.Option(1.5, "--factor", help="Scale multiplier from rung to rung."),
    max_steps: int = typer.Option(8, "--max-steps", help="Rungs at most."),
    step_duration: float = typer.Option(15.0, "--step-duration", help="Seconds of load per rung."),
    load_factor: float = typer.Option(1.5, "--load-factor", help="Give scenarios' --scale for this x."),
) -> None:
    """Find the server's capacity: a scenario at growing rates until throughput stops growing."""
    from loadtest.capacity import SweepRule
    from loadtest.commands import run_capacity

    rule = SweepRule(
        scenario=scenario, model=model, start_scale=start_scale, factor=factor, max_steps=max_steps,
        step_duration_s=step_duration,
    )  # fmt: skip
    run_capacity(url, out, rule, load_factor, console)


@app.command("report")
def report_cmd(
    run: Path | None = typer.Argument(None, help="A loadtest output folder."),
    compare: tuple[Path, Path] | None = typer.Option(None, "--compare", help="Two run folders: A then B."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (A_vs_B; ledger-report)."),
    ledger: str | None = typer.Option(None, "--ledger", help="The ledger: PostgreSQL DSN or SQLite file."),
    start: str | None = typer.Option(None, "--from", help="With --ledger: ISO 8601 or unix s (30 days ago)."),
    end: str | None = typer.Option(None, "--to", help="With --ledger: ISO 8601 or unix seconds (now)."),
    tenancy: Path | None = typer.Option(None, "--tenancy", help="With --ledger: tenancy YAML (SLA targets)."),
    ledger_app: str | None = typer.Option(None, "--app", help="With --ledger: one Serve app's rows only."),
    bucket: str = typer.Option("1d", "--bucket", help="With --ledger: usage buckets, 1h or 1d."),
) -> None:
    """HTML report + PNG figures + terminal tables of a run, of two runs side by side, or of the ledger."""
    from loadtest.report import render_compare, render_run

    if ledger:
        from fairlane.ledger_report import render_ledger

        out = out or Path("ledger-report")
        path = render_ledger(ledger, start, end, out, tenancy, ledger_app, bucket, console)
    elif compare:
        a, b = compare
        path = render_compare(a, b, out or a.parent / f"{a.name}_vs_{b.name}", console)
    elif run is not None:
        path = render_run(run, console)
    else:
        raise typer.BadParameter("give a run folder or --compare A B")
    console.print(f"report: {path}")


@app.command("simulate")
def simulate_cmd(
    scenario: str = typer.Argument(..., help="Scenario name (sim or loadtest scenarios) or YAML path."),
    out: Path = typer.Option(..., "--out", help="Folder: comparison.json, one folder per policy."),
    tenants: int = typer.Option(1000, "--tenants", help="Tenants, cloned from the scenario's."),
    replicas: int = typer.Option(64, "--replicas", help="Replicas (initial ones with --autoscale-max)."),
    requests: int = typer.Option(100_000, "--requests", help="Requests in the trace."),
    policies: str = typer.Option("fcfs,rate_limits,vtc,fairlane", "--policies", help="Comma-separated."),
    load_factor: float = typer.Option(1.5, "--load-factor", help="Offered work / estimated capacity."),
    step_model: str = typer.Option("h200-llama-3.1-8b", "--step-model", help="sim/data/step_<name>.json"),
    autoscale_max: int | None = typer.Option(None, "--autoscale-max", help="Autoscale up to this many."),
    records: bool = typer.Option(True, "--records/--no-records", help="Write per-request records.jsonl."),
    seed: int | None = typer.Option(None, "--seed", help="Override the scenario's seed."),
    routers: int = typer.Option(1, "--routers", help="Routers, each its own fair queue and room share."),
    counter_sync_s: float | None = typer.Option(
        None, "--counter-sync-s", help="Routers' counter exchange period (default: the cluster's, 0.1 s)."
    ),
    router_choice: str = typer.Option(
        "power_of_two", "--router-choice", help="power_of_two, random or tenant_two (its tenant waits least)."
    ),
    share_lifts: bool = typer.Option(
        False, "--share-lifts/--local-lifts", help="Routers share lifts as offsets (tenancy/shared_lifts.py)."
    ),
) -> None:
    """Discrete-event simulation of the real admission, fair queue and dispatch at platform scale."""
    from loadtest.sim.cli import RouterOptions, build_spec, run_cli

    spec = build_spec(
        tenants,
        replicas,
        requests,
        policies,
        load_factor,
        step_model,
        autoscale_max,
        records,
        seed,
        RouterOptions(routers, counter_sync_s, router_choice, share_lifts),
    )
    run_cli(scenario, spec, out, console)


@app.command("simulate-autoscale")
def simulate_autoscale_cmd(
    out: Path = typer.Option(..., "--out", help="The JSON written."),
    tenants: int = typer.Option(1000, "--tenants", help="Tenants in three SLA classes."),
    bound: int = typer.Option(64, "--bound", help="Most replicas (and the fixed row's count)."),
    day_s: float = typer.Option(1200.0, "--day-s", help="Simulated seconds of the compressed day."),
    start_s: float = typer.Option(60.0, "--start-s", help="A replica's start: creation to serving."),
    step_model: str = typer.Option("h200-llama-3.1-8b", "--step-model", help="sim/data/step_<name>.json"),
    seed: int = typer.Option(10, "--seed", help="The trace's seed."),
) -> None:
    """A compressed day (diurnal 10×, two 3× flash crowds) under the SLA autoscaling policy, Serve's
    ongoing-requests policy at three targets, and fixed provisioning for the peak (docs/cluster.md)."""
    from loadtest.sim.autoscale_day import DaySpec
    from loadtest.sim.cli import run_autoscale_cli

    spec = DaySpec(
        tenants=tenants, bound=bound, day_s=day_s, start_s=start_s, step_model=step_model, seed=seed
    )
    run_autoscale_cli(spec, out, console)


@app.command("hash-key")
def hash_key_cmd(
    config: Path | None = typer.Option(None, "--config", help="Tenancy YAML whose key_salt to use."),
    salt_env: str = typer.Option("FAIRLANE_KEY_SALT", "--salt-env", help="Env var with the salt."),
    key: str | None = typer.Option(None, "--key", help="The key; default: stdin (a hidden prompt on a tty)."),
) -> None:
    """Print the stored form of an API key ('hmac-sha256:<hex>') under a deployment's key_salt."""
    from tenancy import TenancyConfigError, hash_api_key
    from tenancy.loader import key_salt_from

    try:
        salt = key_salt_from(config, salt_env)
    except TenancyConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if key is None:  # stdin keeps the key out of shell history and `ps`; the prompt goes to stderr
        tty = sys.stdin.isatty()
        key = typer.prompt("API key", hide_input=True, err=True) if tty else sys.stdin.readline().rstrip("\n")
    if not key:
        raise typer.BadParameter("empty API key")
    typer.echo(hash_api_key(key, salt))


def main() -> None:
    app()
