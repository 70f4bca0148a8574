"""Micro-benchmark: admission + fair-queue decisions per second in one process.

One *decision* is the router's per-request work in the tenancy layer: admit (quota check that
returns a lease), push into the fair queue, pop the next request, charge its output, release
the lease. Runs with the memory store and, when reachable, the Redis store (one request at a
time, and ``--concurrency`` requests in flight on one event loop).

    python -m tenancy.bench --tenants 1000 --json out.json [--redis-url redis://127.0.0.1:6379]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import redis

from tenancy.admission import QuotaManager
from tenancy.config import TenancyConfig
from tenancy.fair_queue import FairQueue
from tenancy.keys import hash_api_key
from tenancy.redis_store import RedisQuotaStore

BENCH_KEY_SALT = "bench-salt-not-a-secret"  # the bench keys are placeholders; any salt of 16+ chars


def bench_config(tenants: int) -> TenancyConfig:
    """``tenants`` tenants over the three classes, with quotas high enough never to refuse."""
    classes = [("interactive", 0, 1.0, True), ("standard", 1, 5.0, True), ("batch", 2, 60.0, False)]
    quotas = {
        "requests_per_minute": 10**9,
        "tokens_per_minute": 10**12,
        "max_concurrent_requests": 10**6,
        "max_tokens_per_request": 4096,
        "max_context_length": 8192,
    }
    return TenancyConfig.model_validate(
        {
            "sla_classes": [
                {
                    "name": n,
                    "priority_tier": t,
                    "ttft_target_s": ttft,
                    "tpot_target_s": 0.1,
                    "e2e_target_s": 60.0,
                    "may_preempt_lower_tiers": p,
                }
                for n, t, ttft, p in classes
            ],
            "tenants": [
                {
                    "id": f"t{i}",
                    "display_name": f"T{i}",
                    "api_key_hashes": [hash_api_key(f"k{i}", BENCH_KEY_SALT)],
                    "weight": 1 + i % 4,
                    "sla_class": classes[i % 3][0],
                    "quotas": quotas,
                }
                for i in range(tenants)
            ],
            "key_salt": BENCH_KEY_SALT,
            "admin_key_hash": hash_api_key("admin", BENCH_KEY_SALT),
        }
    )


async def _one(manager: QuotaManager, queue: FairQueue, tenant_id: str, rid: str) -> None:
    lease = await manager.admit(tenant_id, 200, 100)
    queue.push(queue.make_request(rid, tenant_id, 200, 100))
    item = queue.pop_next(capacity=100_000)
    if item is not None:
        queue.settle(item, 80)
    await manager.release(lease, 80)


async def _run(
    manager: QuotaManager, queue: FairQueue, tenant_ids: list[str], n: int, concurrency: int
) -> float:
    picks = [random.choice(tenant_ids) for _ in range(n)]
    start = time.perf_counter()
    for base in range(0, n, concurrency):
        chunk = picks[base : base + concurrency]
        if concurrency == 1:
            await _one(manager, queue, chunk[0], f"r{base}")
        else:
            await asyncio.gather(*(_one(manager, queue, t, f"r{base + i}") for i, t in enumerate(chunk)))
    return n / (time.perf_counter() - start)


def _queue_only(config: TenancyConfig, n: int) -> float:
    queue = FairQueue.from_config(config)
    ids = [t.id for t in config.tenants]
    for i in range(min(n, 5000)):  # a standing backlog, so pops choose among many tenants
        queue.push(queue.make_request(f"w{i}", ids[i % len(ids)], 100, 50))
    picks = [random.choice(ids) for _ in range(n)]
    start = time.perf_counter()
    for i, tenant_id in enumerate(picks):
        queue.push(queue.make_request(f"r{i}", tenant_id, 100, 50))
        item = queue.pop_next()
        if item is not None:
            queue.settle(item, 50)
    return n / (time.perf_counter() - start)


async def _measure(
    make: Callable[[], Awaitable[QuotaManager]], config: TenancyConfig, n: int, concurrency: int
) -> float:
    manager = await make()
    try:
        ids = [t.id for t in config.tenants]
        return await _run(manager, FairQueue.from_config(config), ids, n, concurrency)
    finally:
        await manager.store.close()


async def run_bench(tenants: int, requests: int, redis_url: str | None, concurrency: int) -> dict[str, Any]:
    config = bench_config(tenants)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        "tenants": tenants,
        "requests": requests,
        "fair_queue_push_pop_per_s": round(_queue_only(config, requests)),
    }

    async def memory() -> QuotaManager:
        return QuotaManager(config)

    results["memory_decisions_per_s"] = round(await _measure(memory, config, requests, 1))
    if redis_url and _reachable(redis_url):
        prefix = f"bench-{uuid.uuid4().hex[:8]}"

        async def shared() -> QuotaManager:
            return QuotaManager(config, RedisQuotaStore.from_url(redis_url, prefix=prefix, op_timeout=1.0))

        n = max(1000, requests // 5)
        results["redis_decisions_per_s"] = round(await _measure(shared, config, n, 1))
        results[f"redis_decisions_per_s_concurrency_{concurrency}"] = round(
            await _measure(shared, config, n, concurrency)
        )
        results["redis_url"] = redis_url
        _cleanup(redis_url, prefix)
    else:
        results["redis_decisions_per_s"] = None
    return results


def _reachable(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=0.2, socket_connect_timeout=0.2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _cleanup(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i : i + 1000])
    client.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379", help="'' to skip Redis")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", help="write results to this JSON file")
    args = parser.parse_args(argv)
    random.seed(args.seed)
    results = asyncio.run(run_bench(args.tenants, args.requests, args.redis_url or None, args.concurrency))
    text = json.dumps(results, indent=2)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
