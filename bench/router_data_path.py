"""One router's data path under load, without a model: requests/s, tokens/s, the latency the path adds
to each token, the router and proxy CPU per request, and the longest hold of the router's loop.

    python -m bench.router_data_path --out docs/bench/router_data_path.json            # full size
    python -m bench.router_data_path --smoke --out /tmp/smoke.json                     # CPU test size
    python -m bench.router_data_path --set stream_channel=false --out before.json      # Serve streams
    python -m bench.router_data_path --set direct_dispatch=true --direct-ingress --out F  # past Serve

The app is the GPU benchmark's (``loadtest/configs/gpu-8b.yaml``: one router, unbounded quotas,
synthetic tokenizer) with ``--replicas`` stand-in replicas (``bench/step_replica.py``: a step every
``--tpot-ms`` gives each running request its due token). Two phases, each with a warm-up and a
measured window: ``--streams`` closed-loop streams of ``--stream-tokens`` tokens, then
``--short-clients`` closed-loop non-streamed requests of ``--short-tokens`` tokens. Clients run in
``--client-procs`` processes (``bench/data_path_client.py``). Per phase: ok requests/s, tokens/s,
streams whose tokens were not each once and in order, each token's lateness (arrival − (first
token's arrival + k × TPOT): what the path added), the gaps between a stream's events, CPU ms per
request of the router, the proxy and the replicas (/proc), and the router loop's longest lag
(``/admin/state`` ``loop_lag``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from ray import serve

from bench.cluster_args import app_setting
from bench.cluster_steps import redis_server
from bench.data_path_client import Plan, Tally, run
from bench.router_cost import BASE_CONFIG, cpu_seconds, serve_pids
from bench.step_replica import BoardStepReplica
from cluster.app import replica_options
from cluster.config import AppConfig, load_app_config, with_overrides
from cluster.ops.local_cluster import free_port, local_cluster
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS

CLIENT_START_TIMEOUT_S = 300.0  # spawning and importing the client processes, on a loaded box
SMOKE = {"streams": 8, "stream_tokens": 24, "short_clients": 8, "duration": 4.0, "warmup": 2.0}
SMOKE |= {"client_procs": 1, "replicas": 1}


def bench_config(args: argparse.Namespace, redis_url: str | None = None) -> AppConfig:
    base = load_app_config(BASE_CONFIG)
    tenancy = Path(__file__).resolve().parents[1] / str(base.tenancy_config)
    room = max(args.streams, args.short_clients)
    engine = base.engine.model_dump() | {"device": "cpu", "max_num_seqs": room}  # the stand-ins' slots
    overrides = {"engine": engine, "replica_num_gpus": 0, "replica_num_cpus": 0, "port": free_port()}
    overrides |= {"tenancy_config": str(tenancy), "replica_room": room, "num_replicas": args.replicas}
    overrides |= {"num_routers": args.routers, "redis_url": redis_url}  # routers share quotas in Redis
    settings = dict(app_setting(s) for s in args.set)
    return AppConfig.model_validate(with_overrides(base.model_dump() | overrides, settings))


def _client_ready(ready: Any) -> None:
    """A client process's start: the client's imports, then wait for the other processes."""
    import bench.data_path_client  # noqa: F401  (what `run` needs, loaded before the clock starts)

    ready.wait(timeout=CLIENT_START_TIMEOUT_S)


def phase(bases: list[str], args: argparse.Namespace, kind: str, pids: dict[str, int]) -> dict[str, Any]:
    """One phase; client process ``p`` sends to router ``bases[p % len(bases)]``."""
    clients = args.streams if kind == "streams" else args.short_clients
    tokens = args.stream_tokens if kind == "streams" else args.short_tokens
    procs = max(1, min(args.client_procs, clients))
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(procs + 1)
    with ctx.Pool(procs, initializer=_client_ready, initargs=(ready,)) as pool:
        # The clock starts once every client process has started and imported its client: on a
        # loaded box spawning them took longer than the warm-up, and a phase measured no request.
        ready.wait(timeout=CLIENT_START_TIMEOUT_S)
        start = time.time() + args.warmup
        end = start + args.duration
        plans = [
            Plan(bases[p % len(bases)], args.model, list(DEMO_KEYS.values()), kind,
                 clients // procs + (p < clients % procs), tokens, args.tpot_ms / 1000, start, end, seed=p)
            for p in range(procs)
        ]  # fmt: skip
        pending = pool.map_async(run, plans)
        time.sleep(max(0.0, start - time.time()))
        for base in bases:  # every router's loop-lag probe starts afresh
            _admin(base, "post", "/admin/timings/reset")
        cpu0 = cpu_seconds(pids)
        spy = _profile(args, kind, pids["router"], end - time.time())
        time.sleep(max(0.0, end - time.time()))
        cpu1 = cpu_seconds(pids)
        states = [_admin(base, "get", "/admin/state") for base in bases]
        tallies: list[Tally] = pending.get(timeout=args.duration + 600)
    if spy is not None:
        spy.wait()
    return summarize(kind, tallies, cpu0, cpu1, args.duration, states)


def direct_ingress_port(pid: int) -> int:
    """The HTTP port Serve's direct ingress gave the router (its range, 30000-31000 by default)."""
    import psutil

    for _ in range(120):
        ports = [c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"]
        ports = sorted(p for p in ports if 30000 <= p < 31000)
        if ports:
            return ports[0]
        time.sleep(0.5)
    raise RuntimeError("the router listens on no direct-ingress port")


def _profile(args: argparse.Namespace, kind: str, pid: int, seconds: float) -> subprocess.Popen | None:
    """py-spy on the router for the window (``--py-spy DIR``): collapsed stacks, every thread."""
    if args.py_spy is None:
        return None
    args.py_spy.mkdir(parents=True, exist_ok=True)
    out = args.py_spy / f"router_{kind}.txt"
    cmd = ["py-spy", "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-f", "raw", "-o", str(out)]
    # Native frames (uvloop's C, the socket writes) need the process paused for each sample.
    cmd += ["--native", "--threads"] if args.py_spy_native else ["--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _admin(base: str, method: str, path: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
    return httpx.request(method, base + path, headers=headers, timeout=30).json()


def summarize(
    kind: str, tallies: list[Tally], cpu0: dict, cpu1: dict, span: float, states: list[dict]
) -> dict[str, Any]:
    """The phase's figures; with several routers, CPU per request ``routers_total`` is all of theirs
    together (``router``, ``router2``, ...: each one's) and the loop lag is the worst router's (each
    router's own: ``router_loop_lags_ms``)."""
    ok = sum(t.ok for t in tallies)
    lateness = np.array([x for t in tallies for x in t.lateness] or [np.nan]) * 1000
    gaps = np.array([x for t in tallies for x in t.gaps] or [np.nan]) * 1000
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu1}
    per = {k: 1000 * v / max(1, ok) for k, v in cpu.items()}
    routers = [k for k in per if k.startswith("router")]
    per["routers_total"] = sum(per[k] for k in routers)  # every router's CPU, over every request
    per["replicas_total"] = sum(v for k, v in per.items() if k.startswith("replica"))
    lags = [s.get("loop_lag") for s in states]
    errors: dict[str, int] = {}
    for t in tallies:
        for name, count in t.errors.items():
            errors[name] = errors.get(name, 0) + count
    return {
        "kind": kind,
        "ok_requests": ok,
        "ok_rps": ok / span,
        "tokens_per_s": sum(t.tokens for t in tallies) / span,
        "failed": sum(t.failed for t in tallies),
        "disordered_streams": sum(t.disordered for t in tallies),
        "errors": errors,
        "token_lateness_ms": _p50_p99(lateness),
        "event_gap_ms": _p50_p99(gaps),
        "cpu_ms_per_request": per,
        "router_plus_proxy_cpu_ms_per_request": per["routers_total"] + per.get("proxy", 0.0),
        "cpu_busy_fraction": {k: v / span for k, v in cpu.items()},
        "routers": len(routers),
        "router_loop_lag_ms": _worst_lag(lags),
        "router_loop_lags_ms": lags,
        "router_gc": [s.get("gc") for s in states],  # each router's collector pauses in the window
        "router_gc_pacer": [s.get("gc_pacer") for s in states],
        "stream_channel": states[0].get("stream_channel"),
        "stream_paths": [s.get("stream_paths") for s in states],  # pushed or pulled, warm-ups included
        "direct_dispatch_sent": [s.get("direct_dispatch") for s in states],  # warm-ups included
    }  # fmt: skip


def _worst_lag(lags: list[dict | None]) -> dict | None:
    known = [lag for lag in lags if lag]
    if not known:
        return None
    worst = {key: max(lag[key] for lag in known) for key in ("max_ms", "p99_ms") if key in known[0]}
    return worst | {"probes": sum(lag.get("probes", 0) for lag in known)}


def _p50_p99(values: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.nanpercentile(values, 50)), "p99": float(np.nanpercentile(values, 99))}


def table(result: dict[str, Any]) -> str:
    rows = ["phase    ok req/s  tokens/s  late p50/p99 ms  router+proxy CPU ms/req  loop lag max ms  bad"]
    for r in result["phases"].values():
        late, lag = r["token_lateness_ms"], (r["router_loop_lag_ms"] or {}).get("max_ms", float("nan"))
        rows.append(
            f"{r['kind']:<8} {r['ok_rps']:8.1f}  {r['tokens_per_s']:8.0f}"
            f"  {late['p50']:6.1f}/{late['p99']:6.1f}"
            f"  {r['router_plus_proxy_cpu_ms_per_request']:23.2f}  {lag:15.1f}"
            f"  {r['failed'] + r['disordered_streams']}"
        )
    return "\n".join(rows)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Where to write the JSON.")
    p.add_argument("--smoke", action="store_true", help="A small run for a CPU test.")
    p.add_argument("--label", default="", help="A name for this run, kept in the JSON.")
    p.add_argument("--streams", type=int, default=512, help="Concurrent streaming clients.")
    p.add_argument("--stream-tokens", type=int, default=512, help="Tokens per streamed request.")
    p.add_argument("--short-clients", type=int, default=256, help="Concurrent short-request clients.")
    p.add_argument("--short-tokens", type=int, default=2, help="Tokens per short request.")
    p.add_argument("--tpot-ms", type=float, default=10.0, help="The stand-in's time per output token.")
    p.add_argument("--replicas", type=int, default=4, help="Stand-in replicas.")
    p.add_argument("--routers", type=int, default=1, help="Routers (more than one: --redis-server).")
    p.add_argument("--redis-server", type=Path, default=None, help="A redis-server binary for the routers.")
    p.add_argument("--duration", type=float, default=30.0, help="Measured seconds per phase.")
    p.add_argument("--warmup", type=float, default=10.0, help="Unmeasured seconds before each phase.")
    p.add_argument("--client-procs", type=int, default=8, help="Client processes.")
    p.add_argument("--phases", default="streams,short", help="Which phases, in order.")
    p.add_argument("--model", default="llama-3.1-8b", help="Model name sent (the base config's).")
    p.add_argument(
        "--direct-ingress", action="store_true", help="Serve's direct ingress: clients reach the router."
    )
    p.add_argument("--py-spy", type=Path, default=None, help="Profile the router into this folder.")
    p.add_argument(
        "--py-spy-native", action="store_true", help="With --py-spy: native frames too (pauses the router)."
    )
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE: an AppConfig override.")
    args = p.parse_args()
    if args.py_spy is not None and shutil.which("py-spy") is None:  # before the cluster starts, not after
        p.error("--py-spy: no py-spy on PATH (the device's packed Python needs it packed too)")
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    return args


def run_phases(args: argparse.Namespace, redis_url: str | None) -> tuple[AppConfig, dict[str, Any]]:
    """Start the app (``--routers`` routers, ``--replicas`` stand-ins) and run each phase on it."""
    cfg = bench_config(args, redis_url)
    if args.direct_ingress:  # read by every Ray process this driver starts
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
    deployment = serve.deployment(BoardStepReplica, **replica_options(cfg))

    def replicas(generation: str) -> serve.Application:
        name, direct = cfg.served_model_name, cfg.direct_dispatch
        return deployment.bind(args.tpot_ms / 1000, generation, name, direct)

    with local_cluster(cfg, replicas=replicas) as base:
        pids = serve_pids()
        routers = [pid for role, pid in pids.items() if role.startswith("router")]
        bases = [base]  # through Serve's proxy, which spreads requests over the routers
        if args.direct_ingress:  # each router serves HTTP on its own port: clients spread over them
            bases = [f"http://127.0.0.1:{direct_ingress_port(pid)}" for pid in routers]
        return cfg, {kind: phase(bases, args, kind, pids) for kind in args.phases.split(",")}


def main() -> None:
    args = parse_args()
    with redis_server(args.redis_server, Path(tempfile.gettempdir())) as redis_url:  # it writes nothing
        cfg, phases = run_phases(args, redis_url)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("RAY_SERVE_")}
    args_seen = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result = {"phases": phases, "args": args_seen, "cpu_count": os.cpu_count()}
    result |= {"direct_ingress": args.direct_ingress, "stream_channel": cfg.stream_channel}
    result |= {"direct_dispatch": cfg.direct_dispatch, "routers": cfg.num_routers}
    result |= {"stream_flush_s": cfg.stream_flush_s, "serve_env": env}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
