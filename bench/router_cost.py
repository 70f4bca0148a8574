"""Requests per second that ONE router sustains when the replica is not the limit.

    python -m bench.router_cost --json docs/bench/cpu_router_rps.json [--concurrency 64] [--duration 30]

The app is the GPU benchmark's (``loadtest/configs/gpu-8b.yaml``: one router, in-memory tenancy,
``stream_interval_s`` 0.05, synthetic tokenizer) with the replica deployment swapped for
``PacedReplica``: no engine, each request's tokens at a fixed step (``--step-ms``), coalesced into
stream items exactly as ``ReplicaServer`` does. The router, the Serve proxy and the hops between
them do all of a real request's work; the replica does almost none. A closed loop of
``--concurrency`` streaming clients (``loadtest.client``) sends ~128-word prompts for
``--max-tokens`` tokens. Reported: ok requests/s in the measured window, and the CPU seconds per
request of each process (proxy, router, replica, this driver + load generator), read from /proc,
so the cost per request can be compared on a box where all of them share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import resource
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from ray import serve

from bench.cluster_args import app_setting
from cluster.app import replica_options
from cluster.config import AppConfig, load_app_config, with_overrides
from cluster.ops.local_cluster import APP_NAME, free_port, local_cluster
from cluster.serving.stream_channel import ChannelSet
from cluster.serving.wire import GenerateArgs
from loadtest.client import endpoint_path, request_body, send
from loadtest.prompts import synthetic_prompt
from loadtest.records import RequestRecord
from tenancy import DEMO_KEYS

BASE_CONFIG = Path(__file__).resolve().parents[1] / "loadtest" / "configs" / "gpu-8b.yaml"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class PacedReplica:
    """Stands in for ``ReplicaServer``: token k of a request is due k steps after it arrives.

    Items leave when ``ReplicaServer`` would send them (the first token at once, then at most one
    item per ``coalesce_s``, the last at once); it sleeps from one item to the next, not per token.
    """

    def __init__(self, step_s: float, max_model_len: int = 4096) -> None:
        self._step = step_s
        self._max_len = max_model_len
        self._running = 0
        self._channels = ChannelSet()

    async def generate_channel(self, args: GenerateArgs) -> dict[str, Any]:
        """As ``ReplicaServer.generate_channel``: the outputs on the router's stream channel."""
        return await self._channels.forward(args, self.generate(args))

    async def generate(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
        n = int(args.sampling["max_tokens"])
        start, sent, last = time.monotonic(), 0, 0.0
        self._running += 1
        try:
            while sent < n:
                # The first token at once; then the first token at least coalesce_s after the last item.
                due = 1 if sent == 0 else max(sent + 1, math.ceil((last + args.coalesce_s) / self._step))
                due = min(n, due)
                await asyncio.sleep(max(0.0, start + due * self._step - time.monotonic()))
                yield self._item(args, sent, due, n)
                sent, last = due, due * self._step
        finally:
            self._running -= 1

    def _item(self, args: GenerateArgs, sent: int, upto: int, n: int) -> dict[str, Any]:
        ids = list(range(1000 + sent, 1000 + upto))
        return {
            "request_id": args.request_id,
            "token_ids": ids,
            "text": "".join(f" w{t}" for t in ids),
            "finish_reason": "length" if upto == n else None,
            "num_prompt_tokens": len(args.prompt_ids),
            "num_output_tokens": upto,
            "index": 0,
            "total_output_tokens": upto,
            "done": upto == n,
            "replica_id": "paced",
        }

    def load(self) -> dict[str, Any]:
        return {"replica_id": "paced", "running": self._running, "waiting": 0, "waiting_tokens": 0}

    def record_routing_stats(self) -> dict[str, Any]:
        return {"kv_blocks_free": 1 << 20, "waiting": 0, "waiting_tokens": 0, "running": self._running}

    def profile(self) -> dict[str, Any]:
        return {"replica_id": "paced"}

    def info(self) -> dict[str, Any]:
        return {"replica_id": "paced", "max_model_len": self._max_len, "kv_tokens": 1 << 20}


def bench_config(args: argparse.Namespace) -> AppConfig:
    """The GPU benchmark's app config, on this machine: CPU, a free port, the room for the load."""
    base = load_app_config(BASE_CONFIG)
    tenancy = Path(__file__).resolve().parents[1] / str(base.tenancy_config)
    room = max(args.concurrency, base.replica_room or 0)
    engine = base.engine.model_dump() | {"device": "cpu", "max_num_seqs": room}  # the stand-in's slots
    overrides = {"engine": engine, "replica_num_gpus": 0, "replica_num_cpus": 0, "port": free_port()}
    overrides |= {"tenancy_config": str(tenancy), "replica_room": room}
    settings = dict(app_setting(s) for s in args.set)
    return AppConfig.model_validate(with_overrides(base.model_dump() | overrides, settings))


def serve_pids() -> dict[str, int]:
    """Process ids of this app's proxy, routers and replicas (Ray's actor table; a debugging API).
    The first router by actor name is ``router``, any others ``router2``, ``router3``, ...; the
    replicas likewise ``replica``, ``replica2``, ..."""
    from ray._private.state import actors

    pids: dict[str, int] = {}
    routers: list[tuple[str, int]] = []
    replicas: list[tuple[str, int]] = []
    for info in actors(actor_state_name="ALIVE").values():
        name = info["Name"]
        if name.startswith("SERVE_PROXY_ACTOR"):
            pids["proxy"] = info["Pid"]
        elif name.startswith(f"SERVE_REPLICA::{APP_NAME}#Router#"):
            routers.append((name, info["Pid"]))
        elif name.startswith(f"SERVE_REPLICA::{APP_NAME}#Replica#"):
            replicas.append((name, info["Pid"]))
    return pids | numbered("router", routers) | numbered("replica", replicas)


def numbered(role: str, named_pids: list[tuple[str, int]]) -> dict[str, int]:
    """``role``, ``role2``, ``role3``, ... in the order of the actors' names."""
    return {role if i == 0 else f"{role}{i + 1}": pid for i, (_, pid) in enumerate(sorted(named_pids))}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each process so far, and of this one (the load generator)."""
    out = {}
    for role, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[role] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["driver_and_client"] = usage.ru_utime + usage.ru_stime
    # The whole machine (every core): busy time, and time the hypervisor gave to others (steal).
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    out["machine_busy"] = (sum(ticks) - ticks[3] - ticks[4] - ticks[7]) / CLK_TCK
    out["machine_steal"] = ticks[7] / CLK_TCK
    return out


async def closed_loop(base: str, args: argparse.Namespace, pids: dict[str, int]) -> dict[str, Any]:
    """``concurrency`` clients back to back; counts requests that end inside the measured window."""
    rng = np.random.default_rng(0)
    prompts = [synthetic_prompt(args.prompt_words, rng) for _ in range(64)]
    keys = itertools.cycle(DEMO_KEYS.values())
    path = endpoint_path("completion")
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    window: dict[str, float] = {}
    done: list[RequestRecord] = []

    async def worker(client: httpx.AsyncClient, w: int) -> None:
        for i in itertools.count():
            body = request_body("completion", args.model, prompts[(w + i) % len(prompts)], args.max_tokens)
            headers = {"Authorization": f"Bearer {next(keys)}"}
            record = RequestRecord(f"{w}-{i}", "", "", 1.0, 0.0, 0.0, max_tokens=args.max_tokens)
            done.append(await send(client, record, path, body, headers, 60.0, time.monotonic))

    async with httpx.AsyncClient(base_url=base, timeout=60.0, limits=limits) as client:
        tasks = [asyncio.create_task(worker(client, w)) for w in range(args.concurrency)]
        await asyncio.sleep(args.warmup)
        window["start"], cpu0 = time.monotonic(), cpu_seconds(pids)
        await asyncio.sleep(args.duration)
        window["end"], cpu1 = time.monotonic(), cpu_seconds(pids)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return summarize(done, window, cpu0, cpu1)


def summarize(
    done: list[RequestRecord], window: dict[str, float], cpu0: dict[str, float], cpu1: dict[str, float]
) -> dict[str, Any]:
    inside = [r for r in done if r.end is not None and window["start"] <= r.end <= window["end"]]
    ok = [r for r in inside if r.ok]
    span = window["end"] - window["start"]
    e2e = sorted(r.end - r.sent for r in ok)
    ttft = sorted(r.first_token - r.sent for r in ok if r.first_token is not None)
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu1}
    return {
        "ok_rps": len(ok) / span,
        "not_ok": len(inside) - len(ok),
        "errors": sorted({str(r.error) for r in inside if not r.ok}),
        "output_tokens_per_request": sum(r.output_tokens for r in ok) / max(1, len(ok)),
        "stream_events_per_request": sum(len(r.token_times) for r in ok) / max(1, len(ok)),
        "e2e_p50_s": _pct(e2e, 0.5),
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p99_s": _pct(ttft, 0.99),
        "window_s": span,
        "cpu_busy_fraction": {k: v / span for k, v in cpu.items()},
        "cpu_ms_per_request": {k: 1000 * v / max(1, len(ok)) for k, v in cpu.items()},
    }


def _pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = bench_config(args)
    replicas = serve.deployment(PacedReplica, **replica_options(cfg)).bind(args.step_ms / 1000)
    with local_cluster(cfg, replicas=replicas) as base:
        pids = serve_pids()
        result = asyncio.run(closed_loop(base, args, pids))
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("RAY_SERVE_")}
    return result | {"args": vars(args) | {"json": str(args.json)}, "pids": pids, "serve_env": env}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True, help="Where to write the result.")
    p.add_argument("--label", default="", help="A name for this run, kept in the JSON.")
    p.add_argument("--concurrency", type=int, default=64, help="Closed-loop clients.")
    p.add_argument("--duration", type=float, default=30.0, help="Measured seconds.")
    p.add_argument("--warmup", type=float, default=10.0, help="Unmeasured seconds first.")
    p.add_argument("--prompt-words", type=int, default=128, help="Prompt length (~tokens).")
    p.add_argument("--max-tokens", type=int, default=34, help="Output tokens per request.")
    p.add_argument("--step-ms", type=float, default=9.0, help="The paced replica's time per token.")
    p.add_argument("--model", default="llama-3.1-8b", help="Model name sent (the base config's).")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE: an AppConfig override.")
    args = p.parse_args()
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    per = ", ".join(f"{k} {v:.2f}" for k, v in result["cpu_ms_per_request"].items())
    print(f"{result['ok_rps']:.1f} ok req/s ({result['not_ok']} not ok); CPU ms per request: {per}")


if __name__ == "__main__":
    main()
